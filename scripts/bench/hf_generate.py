"""transformers' `generate` on the same model and shapes as `tlaloc bench`, for the CPU table.

Loads the GGUF directly (transformers dequantizes it to float32), then for each batch size times
`generate` over random prompt ids (seeded, no padding, end-of-sequence ignored): once for one new
token (prefill plus one step) and once for `gen_len` new tokens. Decode ms/step is the difference
over `gen_len - 1` steps. Prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def timed_generate(model, input_ids, new_tokens: int) -> float:
    attention_mask = torch.ones_like(input_ids)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - started
    assert out.shape[1] == input_ids.shape[1] + new_tokens, out.shape
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=pathlib.Path, required=True)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32
    )
    model.eval()
    load_s = time.perf_counter() - started
    vocab = model.config.vocab_size

    results = []
    for batch in [int(b) for b in args.batch.split(",")]:
        generator = torch.Generator().manual_seed(args.seed + batch)
        input_ids = torch.randint(0, vocab, (batch, args.prompt_len), generator=generator)
        timed_generate(model, input_ids, 2)  # warm-up
        one = [timed_generate(model, input_ids, 1) for _ in range(args.repeats)]
        full = [timed_generate(model, input_ids, args.gen_len) for _ in range(max(1, args.repeats - 1))]
        prefill_s = statistics.median(one)
        decode_s = (statistics.median(full) - prefill_s) / (args.gen_len - 1)
        results.append(
            {
                "batch": batch,
                "prompt_len": args.prompt_len,
                "gen_len": args.gen_len,
                "prefill_ms_total": prefill_s * 1e3,
                "prefill_ms_per_prompt": prefill_s * 1e3 / batch,
                "decode_ms_per_step": decode_s * 1e3,
                "tokens_per_s": batch / decode_s,
            }
        )
    print(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "attn_implementation": model.config._attn_implementation,
                "load_s": load_s,
                "batches": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
