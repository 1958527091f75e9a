"""How fast does this XLA run paged decode attention, written two ways?

TinyLlama's attention shape (32 query heads, 4 KV heads of 64, 22 layers, bf16 pages of 16
tokens), one decode token per row, through JAX on the same XLA build as the CUDA PJRT plugin:

  gather-dot  the exporter's form: gather each row's pages into [B, C, kvHeads, D], then two
              dot_generals (scores, weighted values) accumulating in f32
  fused       the same arithmetic as multiplies and f32 reductions over the gathered pages, so
              that XLA may fuse the gather into the reductions instead of materialising it

Reports ms per step (22 layers) and the ratio to the floor of reading each row's K and V once.
Usage (on the GPU machine): python3 scripts/gpu/attention_probe.py [--bandwidth GBPS]
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp

LAYERS, HEADS, KV_HEADS, D, BS = 22, 32, 4, 64, 16
GROUPS = HEADS // KV_HEADS


def attend(kind, q, pool_k, pool_v, tables, lens):
    b, cols = tables.shape
    c = cols * BS
    k = pool_k[tables].reshape(b, c, KV_HEADS, D)
    v = pool_v[tables].reshape(b, c, KV_HEADS, D)
    mask = jnp.arange(c)[None, :] < lens[:, None]  # [B, C]
    if kind == "gather-dot":
        s = jnp.einsum("bkgd,bckd->bkgc", q, k, preferred_element_type=jnp.float32)
    else:
        s = (q.astype(jnp.float32)[:, :, :, None, :]
             * k.astype(jnp.float32).transpose(0, 2, 1, 3)[:, :, None, :, :]).sum(-1)
    s = jnp.where(mask[:, None, None, :], s * D**-0.5, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    if kind == "gather-dot":
        return jnp.einsum("bkgc,bckd->bkgd", p.astype(jnp.bfloat16), v,
                          preferred_element_type=jnp.float32)
    return (p.astype(jnp.bfloat16).astype(jnp.float32)[..., None]
            * v.astype(jnp.float32).transpose(0, 2, 1, 3)[:, :, None, :, :]).sum(-2)


def step_fn(kind):
    def step(q, pools_k, pools_v, tables, lens):
        for i in range(LAYERS):
            o = attend(kind, q, pools_k[i], pools_v[i], tables, lens)
            q = (q.astype(jnp.float32) + o * 1e-3).astype(jnp.bfloat16)
        return q

    return jax.jit(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bandwidth", type=float, default=None, help="GB/s for the floor")
    ap.add_argument("--cases", default="1x512,64x512,64x2048")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    for case in args.cases.split(","):
        b, c = map(int, case.split("x"))
        cols = c // BS
        blocks = b * cols + 1
        key = jax.random.PRNGKey(0)
        pools_k = [jax.random.normal(jax.random.fold_in(key, i), (blocks, BS, KV_HEADS, D),
                                     jnp.bfloat16) for i in range(LAYERS)]
        pools_v = [jax.random.normal(jax.random.fold_in(key, 100 + i),
                                     (blocks, BS, KV_HEADS, D), jnp.bfloat16)
                   for i in range(LAYERS)]
        tables = (1 + jax.random.permutation(key, b * cols)).reshape(b, cols).astype(jnp.int32)
        lens = jnp.full((b,), c, jnp.int32)
        q = jnp.ones((b, KV_HEADS, GROUPS, D), jnp.bfloat16)
        kv_bytes = 2 * LAYERS * b * c * KV_HEADS * D * 2
        for kind in ["gather-dot", "fused"]:
            fn = step_fn(kind)
            out = fn(q, pools_k, pools_v, tables, lens)
            out.block_until_ready()
            started = time.perf_counter()
            for _ in range(args.iters):
                out = fn(out, pools_k, pools_v, tables, lens)
            out.block_until_ready()
            ms = (time.perf_counter() - started) / args.iters * 1e3
            row = {"kind": kind, "batch": b, "context": c, "ms_per_step": round(ms, 4),
                   "kv_bytes": kv_bytes}
            if args.bandwidth:
                floor = kv_bytes / (args.bandwidth * 1e9) * 1e3
                row["floor_ms"] = round(floor, 4)
                row["x_floor"] = round(ms / floor, 2)
            print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
