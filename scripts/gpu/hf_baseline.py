"""transformers on the GPU, for the GPU lane: greedy ids (the oracle) and generate() speed with a
static cache, on the same weights and GPU that `tlaloc bench` uses.

Decode time per step is the difference of two runs with different numbers of new tokens divided
by that difference, so prefill and launch costs cancel.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, cache_implementation="static",
                         pad_token_id=0, eos_token_id=None)
    torch.cuda.synchronize()
    return time.perf_counter() - started, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], required=True)
    parser.add_argument("--oracle-prompts", help="JSON list of id lists: print greedy ids")
    parser.add_argument("--oracle-new-tokens", type=int, default=32)
    parser.add_argument("--batches", default="")
    parser.add_argument("--contexts", default="512")
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per length (min kept)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype,
                                                 attn_implementation="sdpa").cuda().eval()
    result = {"model": args.model, "dtype": args.dtype, "torch": torch.__version__}
    import transformers
    result["transformers"] = transformers.__version__

    if args.oracle_prompts:
        greedy = []
        with torch.no_grad():
            for prompt in json.loads(args.oracle_prompts):
                ids = torch.tensor([prompt], device="cuda")
                out = model.generate(ids, max_new_tokens=args.oracle_new_tokens,
                                     min_new_tokens=args.oracle_new_tokens, do_sample=False,
                                     pad_token_id=0, eos_token_id=None)
                greedy.append(out[0, len(prompt):].tolist())
        result["greedy"] = greedy

    speed = []
    vocab = model.config.vocab_size
    for context in [int(c) for c in args.contexts.split(",") if c]:
        for batch in [int(b) for b in args.batches.split(",") if b]:
            prompt_len = context - args.gen
            generator = torch.Generator(device="cuda").manual_seed(batch)
            ids = torch.randint(3, vocab, (batch, prompt_len), device="cuda", generator=generator)
            try:
                with torch.no_grad():
                    # Warm up every length first: the static cache is sized per call.
                    for n in (1, 8, args.gen):
                        timed_generate(model, ids, n)
                    runs = range(args.repeats)
                    t_short = min(timed_generate(model, ids, 8)[0] for _ in runs)
                    t_long = min(timed_generate(model, ids, args.gen)[0] for _ in runs)
                    t_prefill = min(timed_generate(model, ids, 1)[0] for _ in runs)
                step = (t_long - t_short) / (args.gen - 8)
                speed.append({"batch": batch, "context": context, "decode_ms_per_step": step * 1e3,
                              "tokens_per_s": batch / step, "prefill_ms": t_prefill * 1e3,
                              "prompt_len": prompt_len})
            except torch.OutOfMemoryError:
                speed.append({"batch": batch, "context": context, "error": "out of memory"})
                torch.cuda.empty_cache()
            print(json.dumps(speed[-1]), flush=True)
    result["speed"] = speed
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
