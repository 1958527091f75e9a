"""Saves a random-weight Llama with transformers, as the GPU lane's fixture and oracle model.

The shapes are those of real models (TinyLlama-1.1B, Llama-3-8B) so that speed is measured on the
bytes a real deployment moves; the weights are random because the GPU machine has no network.
"""
import argparse
import json
import pathlib
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=4096, rope_theta=10000.0),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                           max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="where the weights are initialised")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if (out / "config.json").exists():
        print(f"{out} exists; kept")
        return
    started = time.time()
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    config = LlamaConfig(**SHAPES[args.shape], tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, dtype=dtype)
    # A wide init keeps logits apart so that greedy chains are not decided by rounding.
    config.initializer_range = 0.25 if args.shape == "tiny" else 0.02
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="20GB")
    meta = {"shape": args.shape, "dtype": args.dtype, "seed": args.seed,
            "torch": torch.__version__, "seconds": round(time.time() - started, 1)}
    (out / "tlaloc-fixture.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
