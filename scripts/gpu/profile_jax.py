"""The plain JAX paged decode step (peer_jax.py's) under Nsight Compute, for the kernel-by-kernel
comparison of scripts/gpu/profile_batch.sh: warm-up steps, then `--steps` decode steps between
cudaProfilerStart and cudaProfilerStop, so that `ncu --profile-from-start off` sees those steps'
kernels and nothing of the compile or the warm-up. Pools hold exactly batch x context tokens, as
in peer_jax.py. Run once without ncu first with the same `--cache` (JAX's persistent compilation
cache): XLA's autotuner must not run under the profiler, and a cache hit gives the same kernels.
`--dump` only compiles (XLA_FLAGS dump) and exits.
"""
import argparse
import ctypes
import ctypes.util
import glob
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import peer_check  # noqa: E402
import peer_jax  # noqa: E402


def cudart():
    """A CUDA runtime library to call cudaProfilerStart/Stop from: the system's, else the one in
    JAX's CUDA wheels (nvidia/*/lib), else PyTorch's profiler."""
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", ctypes.util.find_library("cudart")]
    names += glob.glob(os.path.join(os.path.dirname(jax.__file__), "..", "nvidia", "*", "lib",
                                    "libcudart.so*"))
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    import torch  # the GPU machine's Python holds PyTorch, whose profiler calls the same functions

    class TorchProfiler:
        cudaProfilerStart = staticmethod(torch.cuda.profiler.start)
        cudaProfilerStop = staticmethod(torch.cuda.profiler.stop)
    return TorchProfiler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cache", required=True)
    args = parser.parse_args()
    jax.config.update("jax_compilation_cache_dir", args.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    config = peer_check.model_config(args.model)
    params = peer_jax.load_params(args.model, config)
    decode, _, _ = peer_jax.make_programs(config, args.block_size, 8)
    state = peer_jax.State(config, args.batch, args.context, args.block_size, 1)
    start = peer_check.lane_prompt_len(args.context)
    k, v, bt, tokens = state.k, state.v, state.block_tables, state.tokens
    lengths = jnp.full((args.batch,), start, jnp.int32)
    for _ in range(3):
        tokens, lengths, k, v = decode(params, k, v, bt, lengths, tokens)
    tokens.block_until_ready()
    runtime = cudart()
    runtime.cudaProfilerStart()
    for _ in range(args.steps):
        tokens, lengths, k, v = decode(params, k, v, bt, lengths, tokens)
    tokens.block_until_ready()
    runtime.cudaProfilerStop()
    print(f"jax batch {args.batch}: {args.steps} steps profiled", file=sys.stderr)


if __name__ == "__main__":
    main()
