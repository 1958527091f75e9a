"""The Tlaloc platform: vLLM's scheduler over a Tlaloc artifact.

vLLM owns queueing, block allocation, prefix-cache hashing, chunked prefill and stops; the
artifact fixes what the device can run (block size, pool size, ladder, dtype). The platform
makes vLLM's configuration match the artifact where vLLM left a choice open, and refuses by name
anything the user asked for that the artifact cannot honour. Requests are checked one by one in
:meth:`TlalocPlatform.validate_request`, whose refusals reach an API client as a 400.

The model path given to vLLM is the artifact's Hugging Face directory (``ARTIFACT/tokenizer``,
holding ``config.json`` and the tokenizer); the artifact is its parent.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger(__name__)

MANIFEST_FILE = "tlaloc-serving.json"

_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

# Sampling parameters the worker implements, with the value that means "not used" for the
# others; a request setting one of these to anything else is refused by name.
_UNSUPPORTED_SAMPLING = {
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "prompt_logprobs": None,
    "structured_outputs": None,
}


def artifact_of(model_path: str) -> Path:
    """The artifact directory for vLLM's model path: the path's parent when it is the
    artifact's Hugging Face directory."""
    path = Path(model_path)
    for candidate in (path.parent, path):
        if (candidate / MANIFEST_FILE).is_file():
            return candidate
    raise ValueError(
        f"{model_path} is not inside a Tlaloc artifact (no {MANIFEST_FILE} in it or its "
        "parent); give vLLM the artifact's Hugging Face directory, ARTIFACT/tokenizer"
    )


def _default_max_num_seqs(parallel, scheduler) -> set:
    """The values vLLM gives `max_num_seqs` when none is asked for, on this machine: its table
    by usage context, doubled in throughput mode, capped by `max_num_batched_tokens`
    (`EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`). vLLM does not record
    whether the value was asked for, so an asked-for value equal to a default counts as one."""
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs

    world = (getattr(parallel, "pipeline_parallel_size", 1) or 1) * (
        getattr(parallel, "tensor_parallel_size", 1) or 1
    )
    _, by_context = EngineArgs.get_batch_defaults(world)
    values = set(by_context.values()) | {SchedulerConfig.DEFAULT_MAX_NUM_SEQS}
    values |= {2 * v for v in values}
    cap = getattr(scheduler, "max_num_batched_tokens", None)
    if cap:
        values |= {min(v, cap) for v in values}
    return values


def _refuse(what: str, asked, accepted) -> None:
    raise ValueError(
        f"tlaloc: {what} {asked!r} refused; this artifact accepts {accepted}"
    )


class TlalocPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    ray_device_key = ""
    simple_compile_backend = "eager"
    supported_quantization: list[str] = []

    # The artifact's shape, read in check_and_update_config (in the process that builds the
    # scheduler) for validate_request.
    _info = None

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # float32 first: vLLM downcasts a float32 config to the first of these, and an f32
        # artifact runs f32 (a bf16 config keeps bf16).
        return [torch.float32, torch.bfloat16]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "tlaloc"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        # The pools and weights live on the PJRT device, sized by the artifact; vLLM's
        # memory-based sizing is replaced by the artifact's block count.
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return 0.0

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def set_device(cls, device) -> None:
        return None

    @classmethod
    def get_attn_backend_cls(cls, *args, **kwargs) -> str:
        raise ValueError("tlaloc: the artifact's programs hold their own attention")

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm_tlaloc import _tlaloc

        model_config = vllm_config.model_config
        if model_config is None:
            return
        info = _tlaloc.open_artifact(str(artifact_of(model_config.model)))
        info.check_hf_config()
        cls._info = info

        parallel = vllm_config.parallel_config
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
        ):
            size = getattr(parallel, name, 1) or 1
            if size > 1:
                _refuse(name, size, "1 (one device)")
        if vllm_config.speculative_config is not None:
            _refuse("speculative decoding", "on", "none")
        if vllm_config.lora_config is not None:
            _refuse("LoRA", "on", "none (weights are compiled into the artifact)")

        want = _TORCH_DTYPES.get(info.dtype)
        if model_config.dtype != want:
            _refuse("dtype", str(model_config.dtype), f"{want} (the artifact's {info.dtype})")

        cache = vllm_config.cache_config
        # vLLM's spellings of the artifact's K/V pool dtype (`auto` takes whatever it is).
        kv_names = {
            "f32": ("float32",),
            "bf16": ("bfloat16",),
            "f16": ("float16",),
            "i8": ("int8",),
            "f8e4m3fn": ("fp8", "fp8_e4m3"),
        }.get(info.kv_cache_dtype, ())
        if cache.cache_dtype not in ("auto", *kv_names):
            _refuse(
                "kv_cache_dtype",
                cache.cache_dtype,
                f"'auto' (the artifact's K/V pools are {info.kv_cache_dtype})",
            )
        if getattr(cache, "user_specified_block_size", False) and cache.block_size not in (
            None,
            info.block_size,
        ):
            _refuse("block_size", cache.block_size, info.block_size)
        cache.block_size = info.block_size
        if cache.num_gpu_blocks_override not in (None, info.num_blocks):
            _refuse(
                "num_gpu_blocks_override",
                cache.num_gpu_blocks_override,
                f"{info.num_blocks} (the artifact's pool, block 0 the null block)",
            )
        # vLLM's null block 0 is the artifact's scratch block 0; blocks 1.. are allocatable.
        cache.num_gpu_blocks_override = info.num_blocks

        hf_limit = getattr(model_config.hf_text_config, "max_position_embeddings", None)
        if model_config.max_model_len > info.max_context:
            if model_config.max_model_len != hf_limit:
                _refuse("max_model_len", model_config.max_model_len, f"at most {info.max_context}")
            model_config.max_model_len = info.max_context

        scheduler = vllm_config.scheduler_config
        if scheduler.max_num_seqs > info.max_batch:
            # vLLM fills in its own default when none was asked for; only that is lowered.
            if scheduler.max_num_seqs not in _default_max_num_seqs(parallel, scheduler):
                _refuse(
                    "max_num_seqs",
                    scheduler.max_num_seqs,
                    f"at most {info.max_batch} (its largest decode batch)",
                )
            logger.info(
                "tlaloc: vLLM's default max_num_seqs %d lowered to the artifact's largest "
                "decode batch %d",
                scheduler.max_num_seqs,
                info.max_batch,
            )
            scheduler.max_num_seqs = info.max_batch
        scheduler.max_model_len = model_config.max_model_len
        # The worker keeps each request's tokens itself and samples on the host: one step at a
        # time, each step's tokens known before the next is scheduled.
        scheduler.async_scheduling = False

        parallel.worker_cls = "vllm_tlaloc.worker.TlalocWorker"
        compilation = vllm_config.compilation_config
        if hasattr(compilation, "cudagraph_mode"):
            from vllm.config import CUDAGraphMode

            compilation.cudagraph_mode = CUDAGraphMode.NONE

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        # A validation error is vLLM's client error: the OpenAI server answers it with a 400.
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import SamplingParams

        if not isinstance(params, SamplingParams):
            raise VLLMValidationError(
                "tlaloc: pooling requests refused; this artifact generates text"
            )
        for name, unused in _UNSUPPORTED_SAMPLING.items():
            value = getattr(params, name, unused)
            if value not in (unused, [], {}) and not (
                isinstance(unused, float) and value is not None and float(value) == unused
            ):
                raise VLLMValidationError(
                    f"tlaloc: sampling parameter {name}={value!r} refused; the worker "
                    "implements temperature, top_p, top_k, seed, logprobs, stop, "
                    "max_tokens and n",
                    parameter=name,
                    value=value,
                )
        if params.logprobs is not None and params.logprobs > 20:
            raise VLLMValidationError(
                f"tlaloc: logprobs={params.logprobs} refused; at most 20",
                parameter="logprobs",
                value=params.logprobs,
            )
