"""The GPU lane peers' shared parts: the checkpoint's config and weights, the bench's timing
window, and the self-check against transformers that every peer passes before it times anything.

The self-check. transformers, on the same weights and device, generates greedy tokens for a short
prompt at batch 1 in bf16 (the reference tokens), then runs that whole sequence once in bf16 and
once with the model cast to f32, keeping the logits that predicted each generated token. The peer
runs the same prompt through its own decode step (the prompt one token a step, then its own argmax
fed back) and hands over its logits and tokens per step. Random weights give small top-2 margins,
so tokens alone would fail on rounding; the rule is instead, step by step while the two sequences
are the same:
- the peer's logits are within `tol` of the f32 logits (max abs over the vocabulary), where
  `tol = 3 * noise` and `noise` is the largest distance between transformers' own bf16 logits and
  the f32 ones over the checked steps: a bf16 forward written differently (other fusion, other
  accumulation order) rounds differently but by the same order of magnitude, and 3x leaves room
  for that; `tol` is at least one bf16 rounding unit (2^-8) of the largest f32 logit;
- the peer's token equals transformers' token, unless the f32 logits of the two tokens are within
  `2 * tol` of each other (both are then a correct greedy choice under bf16 rounding): the
  sequences part there and the check stops, having compared the steps before.
A peer that fails the rule exits with an error before timing, so it never reports a number.

The reference runs in a subprocess (`python3 peer_check.py reference ...`, or
`--reference-python`), so that its torch memory is gone before a peer allocates its own, and so a
JAX environment without torch can still be checked against a Python that has transformers.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

BF16_UNIT = 2.0 ** -8
CHECK_PROMPT = [1, 5, 9, 33, 2, 7, 100, 42]
CHECK_NEW_TOKENS = 8


def lane_prompt_len(context):
    """The bench's prompt length per context bucket (lane.sh): 320 + 192 at 512, 1536 + 512 at
    2048; other buckets generate 3/8 of the bucket, as 512 does."""
    return {512: 320, 2048: 1536}.get(context, context - (3 * context) // 8)


def model_config(model_dir):
    """The Llama config fields a decode step needs, from the checkpoint's config.json."""
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    heads = raw["num_attention_heads"]
    rope = raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", (raw.get("rope_scaling") or {}).get("rope_type", "default"))
    if rope_type != "default":
        raise SystemExit(f"rope type {rope_type!r} is not supported by the peers (only 'default')")
    return {
        "hidden": raw["hidden_size"],
        "intermediate": raw["intermediate_size"],
        "layers": raw["num_hidden_layers"],
        "heads": heads,
        "kv_heads": raw.get("num_key_value_heads", heads),
        "head_dim": raw.get("head_dim") or raw["hidden_size"] // heads,
        "vocab": raw["vocab_size"],
        "eps": raw.get("rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", raw.get("rope_theta", 10000.0)),
        "tied": raw.get("tie_word_embeddings", False),
    }


def safetensors_files(model_dir):
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise SystemExit(f"no *.safetensors in {model_dir}")
    return files


def weight_names(config):
    """transformers' Llama tensor names, per layer and global."""
    layer = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
             "self_attn.v_proj.weight", "self_attn.o_proj.weight",
             "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
             "mlp.down_proj.weight"]
    return layer, ["model.embed_tokens.weight", "model.norm.weight",
                   "model.embed_tokens.weight" if config["tied"] else "lm_head.weight"]


def reference(model_dir, device, prompt, new_tokens):
    """transformers' greedy tokens and the bf16 and f32 logits that predicted them."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").to(device).eval()
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        rows = slice(len(prompt) - 1, out.shape[1] - 1)
        bf16 = model(out).logits[0, rows].float().cpu().numpy()
        f32 = model.float()(out).logits[0, rows].float().cpu().numpy()
    return {"tokens": out[0, len(prompt):].tolist(), "bf16": bf16, "f32": f32}


def run_reference(model_dir, device, python=None, cache=None, prompt=CHECK_PROMPT,
                  new_tokens=CHECK_NEW_TOKENS):
    """`reference` in a subprocess of `python` (default: this interpreter). With `cache`, a file
    kept from an earlier run on the same model, prompt and device is read instead."""
    key = np.array([os.path.realpath(model_dir), device, ",".join(map(str, prompt)),
                    str(new_tokens)])
    with tempfile.TemporaryDirectory() as tmp:
        path = cache or os.path.join(tmp, "reference.npz")
        data = np.load(path) if cache and os.path.exists(cache) else None
        if data is None or list(data["key"]) != list(key):
            subprocess.run([python or sys.executable, os.path.abspath(__file__), "reference",
                            "--model", model_dir, "--device", device, "--prompt",
                            ",".join(map(str, prompt)), "--new-tokens", str(new_tokens),
                            "--out", path], check=True)
            data = dict(np.load(path), key=key)
            np.savez(path, **data)
        return {"tokens": data["tokens"].tolist(), "bf16": data["bf16"], "f32": data["f32"],
                "prompt": list(prompt)}


def compare(ref, tokens, logits=None):
    """The self-check rule (module doc). `tokens[i]` is the peer's token at step i; `logits[i]`,
    when given, its logits [vocab]. Returns a summary; raises SystemExit on a failure."""
    f32, bf16 = ref["f32"], ref["bf16"]
    noise = float(np.abs(bf16 - f32).max())
    tol = max(3.0 * noise, BF16_UNIT * float(np.abs(f32).max()))
    agreed, max_err = 0, 0.0
    for i, want in enumerate(ref["tokens"]):
        if i >= len(tokens):
            break
        if logits is not None:
            err = float(np.abs(np.asarray(logits[i], dtype=np.float32) - f32[i]).max())
            max_err = max(max_err, err)
            if not err <= tol:
                raise SystemExit(f"self-check failed at step {i}: logits differ from transformers' "
                                 f"f32 logits by {err:.4g}, more than the bf16 tolerance {tol:.4g}")
        got = int(tokens[i])
        if got != want:
            gap = abs(float(f32[i][got] - f32[i][want]))
            if gap <= 2 * tol:
                break
            raise SystemExit(f"self-check failed at step {i}: token {got}, transformers {want}, "
                             f"f32 logits {gap:.4g} apart (more than {2 * tol:.4g})")
        agreed += 1
    return {"agreed_steps": agreed, "of": len(ref["tokens"]), "max_logit_err": max_err,
            "tol": tol, "hf_bf16_noise": noise, "tokens": [int(t) for t in tokens],
            "hf_tokens": list(ref["tokens"])}


def add_peer_args(parser):
    parser.add_argument("--model", required=True, help="safetensors checkpoint directory")
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--steps", type=int, default=0,
                        help="timed decode steps per point (default: the bench's generated "
                             "tokens of the bucket, 192 at 512 and 512 at 2048)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--time-budget", type=float, default=600.0,
                        help="seconds; points that would start after it are skipped")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--reference-python", help="python with transformers for the self-check "
                                                   "(default: this one)")
    parser.add_argument("--reference-cache", help="file for transformers' self-check reference: "
                                                  "read when it matches, else written")


def windows(context, steps):
    """The timed decode positions: windows of the bench's decode range (prompt .. context) until
    `steps` steps are timed. Returns (start position, steps per window, number of windows)."""
    start = lane_prompt_len(context)
    per_window = context - start
    steps = steps or per_window
    per_window = min(per_window, steps)
    return start, per_window, max(1, -(-steps // per_window))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference", help="write transformers' reference for the self-check")
    ref.add_argument("--model", required=True)
    ref.add_argument("--device", default="cuda")
    ref.add_argument("--prompt", required=True)
    ref.add_argument("--new-tokens", type=int, required=True)
    ref.add_argument("--out", required=True)
    args = parser.parse_args()
    got = reference(args.model, args.device, [int(t) for t in args.prompt.split(",")],
                    args.new_tokens)
    np.savez(args.out, tokens=np.array(got["tokens"]), bf16=got["bf16"], f32=got["f32"])


if __name__ == "__main__":
    main()
