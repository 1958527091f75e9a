"""Fixtures of the vLLM plugin tests: the artifact (exported by run.sh), its Hugging Face
directory (what vLLM is given), the transformers goldens and one `LLM` per session."""

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "tests/data/goldens/SmolLM2-135M-Instruct.json"
# Greedy ids must match up to (not including) the first step whose golden top-1/top-2 margin is
# below this: f32 logits agree to ~1e-4 relative, so a smaller margin may flip on rounding.
MIN_MARGIN = 1e-3
# vLLM's scheduler budget per step: smaller than the longer golden prompts, so they are chunked.
PREFILL_CHUNK = 32
MAX_NUM_SEQS = 2


def artifact_dir() -> Path:
    path = os.environ.get("TLALOC_VLLM_ARTIFACT")
    if not path:
        pytest.fail("TLALOC_VLLM_ARTIFACT is not set; run tests/vllm/run.sh")
    return Path(path)


@pytest.fixture(scope="session")
def hf_dir() -> str:
    return str(artifact_dir() / "tokenizer")


@pytest.fixture(scope="session")
def goldens():
    return json.loads(GOLDENS.read_text())["cases"]


def trusted_ids(case) -> list[int]:
    """The golden greedy ids up to the first step with a margin below MIN_MARGIN."""
    cut = next(
        (i for i, s in enumerate(case["steps"]) if s["margin"] < MIN_MARGIN),
        len(case["greedy_ids"]),
    )
    return case["greedy_ids"][:cut]


@pytest.fixture(scope="session")
def llm(hf_dir):
    from vllm import LLM

    engine = LLM(
        model=hf_dir,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=PREFILL_CHUNK,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        seed=0,
    )
    yield engine
    del engine
