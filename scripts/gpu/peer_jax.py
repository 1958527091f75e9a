"""A straightforward JAX paged decode step, no custom kernels: the GPU lane's "what a JAX user
writes" peer to `tlaloc bench` (jax on the lane machine is the same XLA as the CUDA plugin).

Per layer a paged K/V pool [num_blocks, block_size, kv_heads, head_dim] for K and one for V, and a
block table [batch, context / block_size] per step (a random permutation of the blocks, so pages
are scattered as in a serving pool; the pools hold exactly batch x context tokens). One decode
step of a Llama in bf16: embedding; per layer RMSNorm (f32 statistics, as transformers), q/k/v
projections, RoPE at each row's position, the new K/V scattered into its page slot
(`.at[block, offset].set`), each row's pages gathered through its block table, GQA attention with a
mask by sequence length (f32 scores and softmax), o projection, RMSNorm, SwiGLU; final RMSNorm,
LM head, argmax. Two ways to run it, both timed and reported:
- `decode`: one `jax.jit` call per step, pools donated (`donate_argnums`), the argmax and the
  lengths fed back as the next call's inputs without leaving the device; timed over `--steps`
  steps after warm-up, `block_until_ready` at the end of each window;
- `decode_loop`: `--loop-steps` steps inside one `jax.lax.fori_loop` (constant trip count), the
  tokens of every step written to an [N, batch] output.
Decode positions are the bench's (lane.sh: 320..511 at context 512, 1536..2047 at 2048).

Before timing, both ways check themselves against transformers at batch 1 and the first context
(peer_check.py's rule): the step's logits and tokens, then the tokens of the one-call step and of
the loop from the same prompt. Prints one `RESULT {json}` line per (batch, context).
`--device cpu` runs the same code on JAX's CPU backend, to test the script.
"""
import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.flax import load_file  # noqa: E402

import peer_check  # noqa: E402

BF16 = jnp.bfloat16


def load_params(model_dir, config):
    tensors = {}
    for path in peer_check.safetensors_files(model_dir):
        tensors.update(load_file(path))
    layer_names, (embed, norm, head) = peer_check.weight_names(config)
    layers = [tuple(jnp.asarray(tensors[f"model.layers.{i}.{name}"], BF16) for name in layer_names)
              for i in range(config["layers"])]
    return {"embed": jnp.asarray(tensors[embed], BF16), "norm": jnp.asarray(tensors[norm], BF16),
            "head": jnp.asarray(tensors[head], BF16), "layers": layers}


def rms_norm(x, weight, eps):
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    return weight * h.astype(BF16)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def forward(config, block_size, params, k_pools, v_pools, block_tables, lengths, tokens):
    """One decode step. lengths [B] int32: tokens already cached, i.e. the new token's position.
    Returns (logits [B, vocab] bf16, k_pools, v_pools)."""
    heads, kv_heads, dim = config["heads"], config["kv_heads"], config["head_dim"]
    batch, group, eps = tokens.shape[0], heads // kv_heads, config["eps"]
    context = block_tables.shape[1] * block_size
    inv_freq = 1.0 / (config["rope_theta"] ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    freqs = lengths.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb).astype(BF16)[:, None, :], jnp.sin(emb).astype(BF16)[:, None, :]
    visible = jnp.arange(context)[None, :] <= lengths[:, None]
    block = block_tables[jnp.arange(batch), lengths // block_size]
    offset = lengths % block_size
    x = params["embed"][tokens]
    new_k, new_v = [], []
    for (w_in, wq, wk, wv, wo, w_post, w_gate, w_up, w_down), k_pool, v_pool in zip(
            params["layers"], k_pools, v_pools):
        h = rms_norm(x, w_in, eps)
        q = rotate((h @ wq.T).reshape(batch, heads, dim), cos, sin)
        k = rotate((h @ wk.T).reshape(batch, kv_heads, dim), cos, sin)
        v = (h @ wv.T).reshape(batch, kv_heads, dim)
        k_pool = k_pool.at[block, offset].set(k)
        v_pool = v_pool.at[block, offset].set(v)
        new_k.append(k_pool)
        new_v.append(v_pool)
        keys = k_pool[block_tables].reshape(batch, context, kv_heads, dim)
        values = v_pool[block_tables].reshape(batch, context, kv_heads, dim)
        scores = jnp.einsum("bkgd,bckd->bkgc", q.reshape(batch, kv_heads, group, dim), keys,
                            preferred_element_type=jnp.float32) * dim ** -0.5
        scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(BF16)
        attn = jnp.einsum("bkgc,bckd->bkgd", probs, values).reshape(batch, heads * dim)
        x = x + attn @ wo.T
        h = rms_norm(x, w_post, eps)
        x = x + (jax.nn.silu(h @ w_gate.T) * (h @ w_up.T)) @ w_down.T
    logits = rms_norm(x, params["norm"], eps) @ params["head"].T
    return logits, new_k, new_v


def make_programs(config, block_size, loop_steps):
    fwd = functools.partial(forward, config, block_size)

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def decode(params, k_pools, v_pools, block_tables, lengths, tokens):
        logits, k_pools, v_pools = fwd(params, k_pools, v_pools, block_tables, lengths, tokens)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), lengths + 1, k_pools, v_pools

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def decode_with_logits(params, k_pools, v_pools, block_tables, lengths, tokens):
        logits, k_pools, v_pools = fwd(params, k_pools, v_pools, block_tables, lengths, tokens)
        return (jnp.argmax(logits, axis=-1).astype(jnp.int32), lengths + 1, k_pools, v_pools,
                logits)

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def decode_loop(params, k_pools, v_pools, block_tables, lengths, tokens):
        def body(i, carry):
            tokens, lengths, k_pools, v_pools, out = carry
            logits, k_pools, v_pools = fwd(params, k_pools, v_pools, block_tables, lengths,
                                           tokens)
            tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            return tokens, lengths + 1, k_pools, v_pools, out.at[i].set(tokens)

        out = jnp.zeros((loop_steps, tokens.shape[0]), jnp.int32)
        return jax.lax.fori_loop(0, loop_steps, body, (tokens, lengths, k_pools, v_pools, out))

    return decode, decode_with_logits, decode_loop


class State:
    """Pools, block table, lengths and tokens for one (batch, context)."""

    def __init__(self, config, batch, context, block_size, seed, random_pools=True):
        if context % block_size:
            raise SystemExit(f"context {context} is not a multiple of the block size {block_size}")
        pages = context // block_size
        shape = (batch * pages, block_size, config["kv_heads"], config["head_dim"])
        key = jax.random.PRNGKey(seed)
        keys = jax.random.split(key, 2 * config["layers"] + 2)

        def pool(k):
            # Random past K/V (the step reads every page, masked), or zeros for the self-check.
            return jax.random.normal(k, shape, BF16) if random_pools else jnp.zeros(shape, BF16)

        self.k = [pool(k) for k in keys[:config["layers"]]]
        self.v = [pool(k) for k in keys[config["layers"]:2 * config["layers"]]]
        perm = np.random.default_rng(seed).permutation(batch * pages).astype(np.int32)
        self.block_tables = jnp.asarray(perm.reshape(batch, pages))
        self.tokens = jax.random.randint(keys[-1], (batch,), 3, config["vocab"], jnp.int32)
        self.lengths = jnp.zeros((batch,), jnp.int32)


def self_check(config, params, programs, context, block_size, loop_steps, ref):
    decode, decode_with_logits, decode_loop = programs
    prompt, n = ref["prompt"], len(ref["tokens"])

    def prefilled():
        state = State(config, 1, context, block_size, 0, random_pools=False)
        k, v, lengths = state.k, state.v, state.lengths
        for token in prompt:
            nxt, lengths, k, v, logits = decode_with_logits(
                params, k, v, state.block_tables, lengths, jnp.array([token], jnp.int32))
        return state.block_tables, k, v, lengths, nxt, logits

    bt, k, v, lengths, nxt, logits = prefilled()
    tokens, step_logits = [], []
    for _ in range(n):
        tokens.append(int(nxt[0]))
        step_logits.append(np.asarray(logits[0].astype(jnp.float32)))
        nxt, lengths, k, v, logits = decode_with_logits(params, k, v, bt, lengths, nxt)
    check = peer_check.compare(ref, tokens, step_logits)

    bt, k, v, lengths, nxt, _ = prefilled()
    tokens = []
    for _ in range(n):
        tokens.append(int(nxt[0]))
        nxt, lengths, k, v = decode(params, k, v, bt, lengths, nxt)
    check["decode_agreed_steps"] = peer_check.compare(ref, tokens)["agreed_steps"]

    bt, k, v, lengths, nxt, _ = prefilled()
    tokens = [int(nxt[0])]
    while len(tokens) < n:
        nxt, lengths, k, v, out = decode_loop(params, k, v, bt, lengths, nxt)
        tokens += [int(t) for t in np.asarray(out[:, 0])]
    check["loop_agreed_steps"] = peer_check.compare(ref, tokens)["agreed_steps"]
    return check


def time_point(config, params, programs, batch, context, block_size, steps, warmup, loop_steps):
    decode, _, decode_loop = programs
    start, per_window, n_windows = peer_check.windows(context, steps)
    state = State(config, batch, context, block_size, batch * 7919 + context)
    k, v, bt, tokens = state.k, state.v, state.block_tables, state.tokens
    began = time.perf_counter()
    lengths = jnp.full((batch,), start, jnp.int32)
    for _ in range(warmup):
        tokens, lengths, k, v = decode(params, k, v, bt, lengths, tokens)
    lengths = jnp.full((batch,), start, jnp.int32)
    tokens, lengths, k, v, _ = decode_loop(params, k, v, bt, lengths, tokens)
    tokens.block_until_ready()
    compile_s = time.perf_counter() - began

    step_s = 0.0
    for _ in range(n_windows):
        lengths = jnp.full((batch,), start, jnp.int32).block_until_ready()
        began = time.perf_counter()
        for _ in range(per_window):
            tokens, lengths, k, v = decode(params, k, v, bt, lengths, tokens)
        tokens.block_until_ready()
        step_s += time.perf_counter() - began

    calls = max(1, per_window // loop_steps)
    loop_s = 0.0
    for _ in range(n_windows):
        lengths = jnp.full((batch,), start, jnp.int32).block_until_ready()
        began = time.perf_counter()
        for _ in range(calls):
            tokens, lengths, k, v, _ = decode_loop(params, k, v, bt, lengths, tokens)
        tokens.block_until_ready()
        loop_s += time.perf_counter() - began
    return {"decode_ms_per_step": step_s / (per_window * n_windows) * 1e3,
            "tokens_per_s": batch * per_window * n_windows / step_s,
            "loop_ms_per_step": loop_s / (calls * loop_steps * n_windows) * 1e3,
            "loop_tokens_per_s": batch * calls * loop_steps * n_windows / loop_s,
            "steps": per_window * n_windows, "loop_steps": loop_steps,
            "loop_calls": calls * n_windows, "positions": [start, context],
            "compile_s": round(compile_s, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_check.add_peer_args(parser)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--loop-steps", type=int, default=8,
                        help="decode steps inside one fori_loop call")
    args = parser.parse_args()
    began = time.perf_counter()
    config = peer_check.model_config(args.model)
    batches = [int(b) for b in args.batches.split(",") if b]
    contexts = [int(c) for c in args.contexts.split(",") if c]

    ref = peer_check.run_reference(args.model, args.device, args.reference_python,
                                    args.reference_cache)
    jax.config.update("jax_platforms", "cuda" if args.device == "cuda" else "cpu")
    device = jax.devices()[0]
    params = load_params(args.model, config)
    programs = make_programs(config, args.block_size, args.loop_steps)
    check = self_check(config, params, programs, contexts[0], args.block_size, args.loop_steps,
                       ref)
    print("self-check " + json.dumps(check), file=sys.stderr, flush=True)

    info = {"peer": "jax", "jax": jax.__version__, "device": device.device_kind,
            "block_size": args.block_size, "check": check}
    for context in contexts:
        for batch in batches:
            if time.perf_counter() - began > args.time_budget:
                print(f"skipped batch {batch} context {context}: past the time budget",
                      file=sys.stderr)
                continue
            row = dict(info, batch=batch, context=context)
            try:
                row.update(time_point(config, params, programs, batch, context, args.block_size,
                                      args.steps, args.warmup, args.loop_steps))
            except Exception as error:  # a point that fails is reported, the others still run
                row["error"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
            print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
