"""A hand-written PyTorch decode step, compiled and replayed as a CUDA graph: the GPU lane's
"what a torch user writes for speed" peer to `tlaloc bench`.

One decode step of a Llama in bf16 over a static K/V cache per layer ([batch, kv_heads, context,
head_dim]): embedding, then per layer RMSNorm, q/k/v projections, RoPE at the step's position
(tables made as transformers makes them: f32, then cast), the new K/V written with `index_copy_` at
the position, attention as two matmuls with a mask by length (f32 softmax), o projection, RMSNorm,
SwiGLU; final RMSNorm, LM head, argmax. All rows decode at one position (the step reads the whole
cache, masked, so its cost does not depend on where the rows are). The step is compiled with
`torch.compile(mode=--compile-mode, dynamic=False)` (one compile per (batch, context), each kept),
then captured with `torch.cuda.CUDAGraph` together with the feedback (the argmax copied into the
static input, the position advanced), so each replay is one greedy step with no host work. Timing: CUDA events around `--steps` replays over
the bench's decode positions (lane.sh: 320..511 at context 512, 1536..2047 at 2048), after warm-up.

`--device cpu` runs the same step compiled (or eager with `--compile-mode none`) without a CUDA
graph, timed with `time.perf_counter`; it exists to test the script, not to measure.

Before any timing the step checks itself against transformers (peer_check.py's rule), on the path
that is timed: the compiled (and on CUDA, graph-captured) step at batch 1 and the first context.
Prints one `RESULT {json}` line per (batch, context).
"""
import argparse
import json
import sys
import time

import torch
from safetensors.torch import load_file

import peer_check


def load_weights(model_dir, config, device):
    tensors = {}
    for path in peer_check.safetensors_files(model_dir):
        tensors.update(load_file(path, device=device))
    layer_names, (embed, norm, head) = peer_check.weight_names(config)
    layers = [[tensors[f"model.layers.{i}.{name}"].to(torch.bfloat16) for name in layer_names]
              for i in range(config["layers"])]
    return {"embed": tensors[embed].to(torch.bfloat16), "norm": tensors[norm].to(torch.bfloat16),
            "head": tensors[head].to(torch.bfloat16), "layers": layers}


def rope_tables(config, context, device):
    """cos/sin [context, head_dim] as transformers' default RoPE computes them, cast to bf16."""
    dim = config["head_dim"]
    inv_freq = 1.0 / (config["rope_theta"] ** (
        torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    freqs = torch.arange(context, device=device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def rms_norm(x, weight, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(torch.bfloat16)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def make_step(config):
    heads, kv_heads, dim = config["heads"], config["kv_heads"], config["head_dim"]
    group, eps, scale = heads // kv_heads, config["eps"], dim ** -0.5

    def step(tokens, pos, embed, norm, head, layers, k_caches, v_caches, cos_table, sin_table,
             positions):
        """tokens [B] int64, pos [1] int64 (the new token's position); returns (next [B], logits
        [B, vocab] bf16). Writes the new K/V into the caches in place."""
        batch = tokens.shape[0]
        x = embed[tokens]
        cos = cos_table.index_select(0, pos)
        sin = sin_table.index_select(0, pos)
        visible = positions <= pos
        for (w_in, wq, wk, wv, wo, w_post, w_gate, w_up, w_down), k_cache, v_cache in zip(
                layers, k_caches, v_caches):
            h = rms_norm(x, w_in, eps)
            q = rotate((h @ wq.t()).view(batch, heads, dim), cos, sin)
            k = rotate((h @ wk.t()).view(batch, kv_heads, dim), cos, sin)
            v = (h @ wv.t()).view(batch, kv_heads, dim)
            k_cache.index_copy_(2, pos, k.unsqueeze(2))
            v_cache.index_copy_(2, pos, v.unsqueeze(2))
            q = q.view(batch, kv_heads, group, dim)
            scores = torch.matmul(q, k_cache.transpose(-1, -2)).float() * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
            attn = torch.matmul(probs, v_cache).reshape(batch, heads * dim)
            x = x + attn @ wo.t()
            h = rms_norm(x, w_post, eps)
            x = x + (torch.nn.functional.silu(h @ w_gate.t()) * (h @ w_up.t())) @ w_down.t()
        logits = rms_norm(x, norm, eps) @ head.t()
        return logits.argmax(-1), logits

    return step


class Runner:
    """One (batch, context): static caches and inputs, the compiled step, and (CUDA) its graph.
    `advance()` runs one greedy step: the argmax becomes the next input, the position moves on."""

    def __init__(self, config, weights, step, batch, context, device, compile_mode):
        self.device = device
        kv, dim, layers = config["kv_heads"], config["head_dim"], config["layers"]
        gen = torch.Generator(device=device).manual_seed(batch * 7919 + context)
        # Random past K/V: the bench's rows hold real prompts, but the step reads every position
        # (masked), so the values only have to be finite.
        self.k = [torch.randn(batch, kv, context, dim, generator=gen, device=device,
                              dtype=torch.bfloat16) for _ in range(layers)]
        self.v = [torch.randn_like(c) for c in self.k]
        self.cos, self.sin = rope_tables(config, context, device)
        self.positions = torch.arange(context, device=device)
        self.tokens = torch.randint(3, config["vocab"], (batch,), generator=gen, device=device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=device)
        self.weights = weights
        fn = step if compile_mode == "none" else torch.compile(step, mode=compile_mode,
                                                                 dynamic=False, fullgraph=True)
        self.fn = fn
        started = time.perf_counter()
        self.graph = None
        if device == "cuda":
            # Compile and warm up on a side stream, then capture the step and its feedback.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._eager_advance()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._eager_advance()
            torch.cuda.synchronize()
        else:
            self._eager_advance()
        self.compile_s = time.perf_counter() - started

    def _eager_advance(self):
        w = self.weights
        nxt, logits = self.fn(self.tokens, self.pos, w["embed"], w["norm"], w["head"],
                              w["layers"], self.k, self.v, self.cos, self.sin, self.positions)
        self.logits = logits
        self.tokens.copy_(nxt)
        self.pos.add_(1)

    def advance(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._eager_advance()

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()


def self_check(runner, ref):
    """peer_check's rule on the runner's path: the prompt a token a step, then its own argmax."""
    prompt = ref["prompt"]
    runner.pos.fill_(0)
    logits, tokens = [], []
    for i, token in enumerate(prompt):
        runner.tokens[0] = token
        runner.advance()
    for _ in range(len(ref["tokens"])):
        runner.sync()
        tokens.append(int(runner.tokens[0]))
        logits.append(runner.logits[0].float().cpu().numpy())
        runner.advance()
    runner.sync()
    return peer_check.compare(ref, tokens, logits)


def time_point(runner, context, steps, warmup):
    start, per_window, n_windows = peer_check.windows(context, steps)
    runner.pos.fill_(start)
    for _ in range(warmup):
        runner.advance()
    elapsed = 0.0
    for _ in range(n_windows):
        runner.pos.fill_(start)
        runner.sync()
        if runner.device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(per_window):
                runner.advance()
            end.record()
            end.synchronize()
            elapsed += begin.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            for _ in range(per_window):
                runner.advance()
            elapsed += time.perf_counter() - began
    return elapsed / (per_window * n_windows), per_window * n_windows, start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_check.add_peer_args(parser)
    parser.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                        choices=["max-autotune-no-cudagraphs", "default", "none"],
                        help="torch.compile mode (the CUDA graph is captured by this script)")
    args = parser.parse_args()
    began = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.assume_static_by_default = True
    # One compile per (batch, context), all kept: a captured graph's kernels must stay loaded.
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                  "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)
    device = args.device
    config = peer_check.model_config(args.model)
    batches = [int(b) for b in args.batches.split(",") if b]
    contexts = [int(c) for c in args.contexts.split(",") if c]

    ref = peer_check.run_reference(args.model, device, args.reference_python,
                                    args.reference_cache)
    weights = load_weights(args.model, config, device)
    step = make_step(config)
    check_runner = Runner(config, weights, step, 1, contexts[0], device, args.compile_mode)
    check = self_check(check_runner, ref)
    print("self-check " + json.dumps(check), file=sys.stderr, flush=True)

    info = {"peer": "torch", "torch": torch.__version__, "compile_mode": args.compile_mode,
            "cuda_graph": device == "cuda", "device": torch.cuda.get_device_name()
            if device == "cuda" else "cpu", "check": check}
    for context in contexts:
        for batch in batches:
            row = dict(info, batch=batch, context=context)
            if time.perf_counter() - began > args.time_budget:
                print(f"skipped batch {batch} context {context}: past the time budget",
                      file=sys.stderr)
                continue
            try:
                if (batch, context) == (1, contexts[0]):
                    runner = check_runner
                else:
                    runner = None
                    runner = Runner(config, weights, step, batch, context, device,
                                    args.compile_mode)
                seconds, steps, start = time_point(runner, context, args.steps, args.warmup)
                row.update(decode_ms_per_step=seconds * 1e3, tokens_per_s=batch / seconds,
                           steps=steps, positions=[start, context],
                           compile_s=round(runner.compile_s, 1))
            except torch.OutOfMemoryError:
                row["error"] = "out of memory"
            except Exception as error:  # a point that fails is reported, the others still run
                row["error"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
            del runner
            if device == "cuda":
                torch.cuda.empty_cache()
            print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
