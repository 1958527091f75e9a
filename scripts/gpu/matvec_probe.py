"""How fast does this XLA run the weight matmuls of a decode step, written several ways?

Runs the weight matmuls of a TinyLlama-shaped decode step (22 layers of q/k/v, o, gate/up and
down projections, then the LM head) as one jitted function, through JAX on the same XLA build as
the CUDA PJRT plugin, and reports ms per step and the ratio to the copy-bandwidth floor for each
way of writing the matmul:

  dot-kn   dot_general of x[M,K] with W[K,N] (the exporter's layout), f32 accumulation
  dot-nk   dot_general of x[M,K] with W[N,K] (contracting the minor dimension of both)
  mulred   (x[M,1,K] * W[1,N,K]).sum(-1) in f32: a reduction fusion instead of a GEMM

Usage (on the GPU machine): python3 scripts/gpu/matvec_probe.py [--batches 1,8,64] [--bandwidth GBPS]
Prints one JSON object per (formulation, batch) on lines starting with RESULT.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp

HIDDEN, INTER, LAYERS, VOCAB = 2048, 5632, 22, 32000
QKV = HIDDEN + 2 * 256  # 32 query heads, 4 KV heads of 64


def shapes():
    per_layer = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]
    return [s for _ in range(LAYERS) for s in per_layer] + [(HIDDEN, VOCAB)]


def matmul(kind, x, w):
    if kind == "dot-kn":
        return jax.lax.dot_general(
            x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
    if kind == "dot-nk":
        return jax.lax.dot_general(
            x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )
    if kind == "mulred":
        return (x[:, None, :].astype(jnp.float32) * w[None].astype(jnp.float32)).sum(-1)
    raise ValueError(kind)


def step_fn(kind):
    def step(x, weights):
        h = x
        out = []
        for i in range(LAYERS):
            qkv, o, gu, down = weights[4 * i : 4 * i + 4]
            a = matmul(kind, h, qkv)[:, :HIDDEN].astype(jnp.bfloat16)
            h = (h.astype(jnp.float32) + matmul(kind, a, o) * 1e-3).astype(jnp.bfloat16)
            g = matmul(kind, h, gu)
            m = (jax.nn.silu(g[:, :INTER]) * g[:, INTER:]).astype(jnp.bfloat16)
            h = (h.astype(jnp.float32) + matmul(kind, m, down) * 1e-3).astype(jnp.bfloat16)
        out = matmul(kind, h, weights[-1])
        return h, jnp.argmax(out, axis=-1)

    return jax.jit(step)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--kinds", default="dot-kn,dot-nk,mulred")
    p.add_argument("--bandwidth", type=float, default=None, help="GB/s for the floor")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    key = jax.random.PRNGKey(0)
    weight_bytes = sum(k * n for k, n in shapes()) * 2
    for kind in args.kinds.split(","):
        keys = jax.random.split(key, len(shapes()))
        weights = [
            (jax.random.normal(k, (n, kk) if kind != "dot-kn" else (kk, n), jnp.float32) * 0.02)
            .astype(jnp.bfloat16)
            for k, (kk, n) in zip(keys, shapes())
        ]
        fn = step_fn(kind)
        for batch in map(int, args.batches.split(",")):
            if kind == "mulred" and batch > 8:
                continue
            x = jnp.ones((batch, HIDDEN), jnp.bfloat16)
            started = time.perf_counter()
            h, t = fn(x, weights)
            t.block_until_ready()
            compile_s = time.perf_counter() - started
            for _ in range(5):
                h, t = fn(h, weights)
            t.block_until_ready()
            started = time.perf_counter()
            for _ in range(args.iters):
                h, t = fn(h, weights)
            t.block_until_ready()
            ms = (time.perf_counter() - started) / args.iters * 1e3
            row = {"kind": kind, "batch": batch, "ms_per_step": round(ms, 4),
                   "weight_bytes": weight_bytes, "compile_s": round(compile_s, 2)}
            if args.bandwidth:
                floor_ms = weight_bytes / (args.bandwidth * 1e9) * 1e3
                row["floor_ms"] = round(floor_ms, 4)
                row["x_floor"] = round(ms / floor_ms, 2)
            print("RESULT " + json.dumps(row), flush=True)
        del weights


if __name__ == "__main__":
    main()
