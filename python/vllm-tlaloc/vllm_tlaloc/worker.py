"""The Tlaloc worker: runs vLLM's scheduled steps on the artifact through the Rust runtime.

It keeps each request's tokens and block table from the scheduler's messages (new requests
bring their prompt and blocks; cached ones bring appended blocks, or all tokens and blocks when
resumed), and lays every scheduled request out as one row from its ``num_computed_tokens``:
a prefill chunk continues from wherever vLLM's prefix cache or an earlier chunk left it, a
decode row is the last sampled token. Rows that finish their prompt (or decode) produce a token:
greedy rows take the program's in-graph argmax and read no logits back; the others, and any
asking for logprobs, read their logits and go through vLLM's sampler. Both message shapes (the
V1 model runner's ``all_token_ids`` for resumed requests, the V2 runner's full token list in
``prefill_token_ids``) are handled.

The device client is created in :meth:`TlalocWorker.load_model`, in the engine process, never at
import (vLLM forks that process after importing plugins).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from vllm_tlaloc.platform import artifact_of

logger = init_logger(__name__)

# vLLM's threshold below which a temperature means greedy.
_GREEDY_EPS = 1e-5


@dataclass
class _Request:
    token_ids: list[int]
    block_ids: list[int]
    params: object
    generator: torch.Generator | None = None
    computed: int = 0

    @property
    def greedy(self) -> bool:
        return self.params is None or self.params.temperature < _GREEDY_EPS


class TlalocWorker(WorkerBase):
    def __init__(self, vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=False, **kwargs):
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.artifact = artifact_of(self.model_config.model)
        self.executor = None
        self.requests: dict[str, _Request] = {}
        self._sampler = None

    # -- life cycle -------------------------------------------------------------------------

    def init_device(self) -> None:
        self.device = torch.device("cpu")

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        from vllm_tlaloc import _tlaloc

        plugin = os.environ.get("TLALOC_PJRT_PLUGIN_PATH") or "auto"
        self.executor = _tlaloc.load(str(self.artifact), plugin=plugin)
        self.info = self.executor.info
        logger.info("tlaloc: %s on %s", self.info, self.executor.plugin_path)

    def get_model(self):
        return None

    def get_supported_tasks(self):
        return ("generate",)

    def get_kv_cache_spec(self):
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        info = self._shape()
        dtype = {
            "f32": torch.float32,
            "bf16": torch.bfloat16,
            "f16": torch.float16,
            "i8": torch.int8,
            "f8e4m3fn": torch.float8_e4m3fn,
        }[info.kv_cache_dtype]
        # One spec stands for all the artifact's layers: vLLM only needs the block size for its
        # block tables; the pools themselves live on the PJRT device.
        return {
            "tlaloc.pools": FullAttentionSpec(
                block_size=info.block_size,
                num_kv_heads=info.num_kv_heads,
                head_size=info.head_dim,
                dtype=dtype,
            )
        }

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]

    def determine_available_memory(self) -> int:
        spec = self.get_kv_cache_spec()["tlaloc.pools"]
        return spec.page_size_bytes * self._shape().num_blocks

    def initialize_from_config(self, kv_cache_config) -> None:
        configs = kv_cache_config if isinstance(kv_cache_config, list) else [kv_cache_config]
        for config in configs:
            if config.num_blocks != self._shape().num_blocks:
                raise ValueError(
                    f"tlaloc: vLLM allocated {config.num_blocks} KV blocks; the artifact's pool "
                    f"has {self._shape().num_blocks} (block 0 the null block)"
                )

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def get_cache_block_size_bytes(self) -> int:
        return self.get_kv_cache_spec()["tlaloc.pools"].page_size_bytes

    def check_health(self) -> None:
        return None

    def synchronize_device(self) -> None:
        return None

    def execute_dummy_batch(self) -> None:
        return None

    def take_draft_token_ids(self):
        return None

    def add_lora(self, lora_request) -> bool:
        raise ValueError("tlaloc: LoRA refused; weights are compiled into the artifact")

    def remove_lora(self, lora_id: int) -> bool:
        return False

    def pin_lora(self, lora_id: int) -> bool:
        return False

    def list_loras(self) -> set[int]:
        return set()

    def shutdown(self) -> None:
        self.executor = None

    def _shape(self):
        if self.executor is not None:
            return self.executor.info
        from vllm_tlaloc import _tlaloc

        return _tlaloc.open_artifact(str(self.artifact))

    # -- steps ------------------------------------------------------------------------------

    def _update_states(self, out) -> None:
        for req_id in out.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            tokens = new.prefill_token_ids if new.prefill_token_ids is not None else new.prompt_token_ids
            if tokens is None:
                raise ValueError(f"tlaloc: request {new.req_id} has no token ids (embeddings refused)")
            params = new.sampling_params
            generator = None
            if params is not None and params.seed is not None:
                generator = torch.Generator().manual_seed(params.seed)
            self.requests[new.req_id] = _Request(
                token_ids=list(tokens),
                block_ids=list(new.block_ids[0]),
                params=params,
                generator=generator,
                computed=new.num_computed_tokens,
            )
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            req = self.requests[req_id]
            blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                req.block_ids = list(blocks[0]) if blocks is not None else []
            elif blocks is not None:
                req.block_ids.extend(blocks[0])
            if req_id in cached.all_token_ids:
                req.token_ids = list(cached.all_token_ids[req_id])
            req.computed = cached.num_computed_tokens[i]

    def execute_model(self, scheduler_output) -> ModelRunnerOutput:
        out = scheduler_output
        self._update_states(out)
        req_ids = list(out.num_scheduled_tokens.keys())
        rows = []
        finishing = []
        for req_id in req_ids:
            req = self.requests[req_id]
            start = req.computed
            count = out.num_scheduled_tokens[req_id]
            tokens = req.token_ids[start : start + count]
            if len(tokens) != count:
                raise RuntimeError(
                    f"tlaloc: request {req_id} scheduled {count} tokens from {start} but "
                    f"{len(req.token_ids)} are known"
                )
            finishes = start + count >= len(req.token_ids)
            wants_logprobs = req.params is not None and req.params.logprobs is not None
            want_logits = finishes and (not req.greedy or wants_logprobs)
            rows.append((tokens, start, req.block_ids, want_logits))
            finishing.append(finishes)

        results = self.executor.execute(rows) if rows else []

        sampled: list[list[int]] = [[] for _ in req_ids]
        logits_rows: dict[int, torch.Tensor] = {}
        for i, (next_token, logits) in enumerate(results):
            if logits is not None:
                logits_rows[i] = torch.frombuffer(bytearray(logits), dtype=torch.float32)
            if finishing[i]:
                sampled[i] = [next_token]
        random = [i for i in logits_rows if not self.requests[req_ids[i]].greedy]
        if random:
            for i, token in zip(random, self._sample([req_ids[i] for i in random], [logits_rows[i] for i in random])):
                sampled[i] = [token]
        logprobs = self._logprobs(req_ids, sampled, logits_rows)

        for i, req_id in enumerate(req_ids):
            if sampled[i]:
                self.requests[req_id].token_ids.append(sampled[i][0])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=logprobs,
        )

    def _sample(self, req_ids: list[str], logits: list[torch.Tensor]) -> list[int]:
        """vLLM's sampler (temperature, top-k, top-p, per-request seeds) over the rows' logits."""
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler

        if self._sampler is None:
            self._sampler = Sampler()
        reqs = [self.requests[r] for r in req_ids]
        n = len(reqs)
        top_k = [r.params.top_k if r.params.top_k and r.params.top_k > 0 else 0 for r in reqs]
        top_p = [r.params.top_p for r in reqs]
        vocab = logits[0].numel()
        metadata = SamplingMetadata(
            temperature=torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32),
            all_greedy=False,
            all_random=True,
            top_p=None if all(p >= 1.0 for p in top_p) else torch.tensor(top_p, dtype=torch.float32),
            top_k=None if not any(top_k) else torch.tensor([k or vocab for k in top_k], dtype=torch.int32),
            generators={i: r.generator for i, r in enumerate(reqs) if r.generator is not None},
            max_num_logprobs=None,
            no_penalties=True,
            prompt_token_ids=None,
            frequency_penalties=torch.zeros(n),
            presence_penalties=torch.zeros(n),
            repetition_penalties=torch.ones(n),
            output_token_ids=[[] for _ in reqs],
            allowed_token_ids_mask=None,
            bad_words_token_ids={},
            logitsprocs=LogitsProcessors(),
        )
        out = self._sampler(torch.stack(logits), metadata)
        return [int(t) for t in out.sampled_token_ids.view(-1).tolist()]

    def _logprobs(self, req_ids, sampled, logits_rows) -> LogprobsLists | None:
        wanted = {
            i: self.requests[r].params.logprobs
            for i, r in enumerate(req_ids)
            if sampled[i] and i in logits_rows and self.requests[r].params.logprobs is not None
        }
        if not wanted:
            return None
        from vllm.v1.sample.sampler import Sampler

        k = max(wanted.values())
        n = len(req_ids)
        ids = np.zeros((n, k + 1), dtype=np.int64)
        values = np.zeros((n, k + 1), dtype=np.float32)
        ranks = np.zeros(n, dtype=np.int64)
        rows = sorted(wanted)
        raw = Sampler.compute_logprobs(torch.stack([logits_rows[i] for i in rows]))
        token = torch.tensor([sampled[i][0] for i in rows], dtype=torch.int64)
        gathered = Sampler.gather_logprobs(raw, k, token)
        for j, i in enumerate(rows):
            ids[i] = gathered.logprob_token_ids[j].numpy()
            values[i] = gathered.logprobs[j].numpy()
            ranks[i] = int(gathered.selected_token_ranks[j])
        return LogprobsLists(ids, values, ranks)
