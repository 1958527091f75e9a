"""`LLM.generate` on the SmolLM2 artifact through the plugin, against transformers' goldens."""

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import MIN_MARGIN, PREFILL_CHUNK, trusted_ids
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def generate_goldens(llm, goldens):
    prompts = [TokensPrompt(prompt_token_ids=c["prompt_ids"]) for c in goldens]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    return llm.generate(prompts, params)


def test_greedy_matches_transformers_with_chunked_prefill(llm, goldens):
    # Several prompts at once (more than the engine runs together), some longer than the
    # scheduler's per-step budget, two sharing the chat template's system prefix; twice, the
    # second time over a pool whose freed blocks are partly reused and partly evicted.
    assert any(len(c["prompt_ids"]) > PREFILL_CHUNK for c in goldens)
    for round in ("cold", "warm"):
        outputs = generate_goldens(llm, goldens)
        for case, out in zip(goldens, outputs):
            want = trusted_ids(case)
            assert len(want) >= 8, case["name"]
            got = list(out.outputs[0].token_ids)
            assert got[: len(want)] == want, f"{round} {case['name']}"


def test_shared_prefix_hits_the_cache_on_first_sight(llm, goldens):
    by_name = {c["name"]: c for c in goldens}
    a, b = by_name["chat_capital"], by_name["chat_turns"]
    shared = next(i for i, (x, y) in enumerate(zip(a["prompt_ids"], b["prompt_ids"])) if x != y)
    assert shared >= 16
    llm.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=a["prompt_ids"])], params)
    out = llm.generate([TokensPrompt(prompt_token_ids=b["prompt_ids"])], params)[0]
    assert out.num_cached_tokens >= shared // 16 * 16
    want = trusted_ids(b)[:8]
    assert list(out.outputs[0].token_ids)[: len(want)] == want


def test_logprobs_are_the_goldens_log_softmax(llm, goldens):
    case = goldens[0]
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, ignore_eos=True)
    out = llm.generate([TokensPrompt(prompt_token_ids=case["prompt_ids"])], params)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 4
    for step, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        golden = case["steps"][step]
        assert token == case["greedy_ids"][step]
        # The golden top logits differ from our logits by the logits tolerance; log-softmax
        # differences between the top ids are differences of logits, so they agree within it.
        top = golden["top_logits"]
        scale = max(abs(v) for v in top)
        for rank, tid in enumerate(golden["top_ids"][:3]):
            if rank > 0 and top[rank - 1] - top[rank] < MIN_MARGIN:
                break
            assert tid in lp, (step, tid, list(lp))
            diff = lp[token].logprob - lp[tid].logprob
            assert math.isclose(diff, top[0] - top[rank], abs_tol=2e-4 * scale), (step, rank)
        assert lp[token].rank == 1
        assert sum(math.exp(v.logprob) for v in lp.values()) <= 1.0 + 1e-5


def test_a_repeated_prompt_is_served_from_the_prefix_cache(llm, goldens):
    case = next(c for c in goldens if c["name"] == "chat_turns")
    prompt = TokensPrompt(prompt_token_ids=case["prompt_ids"])
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    # Every full block of the prompt but the one holding its last token comes from the cache.
    assert again.num_cached_tokens >= (len(case["prompt_ids"]) - 1) // 16 * 16 > 0
    want = trusted_ids(case)[:16]
    assert list(first.outputs[0].token_ids)[: len(want)] == want
    assert list(again.outputs[0].token_ids)[: len(want)] == want


def test_seeded_sampling_goes_through_vllms_sampler_and_repeats(llm, goldens):
    prompt = TokensPrompt(prompt_token_ids=goldens[0]["prompt_ids"])
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=40, seed=1234, max_tokens=16, ignore_eos=True)
    first = llm.generate([prompt], params)[0].outputs[0].token_ids
    second = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert list(first) == list(second)
    other = SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True)
    assert len(llm.generate([prompt], other)[0].outputs[0].token_ids) == 16


@pytest.mark.parametrize(
    "params, named",
    [
        (dict(presence_penalty=0.5), "presence_penalty"),
        (dict(min_p=0.1), "min_p"),
        (dict(logit_bias={1: 2.0}), "logit_bias"),
    ],
)
def test_unimplemented_sampling_parameters_are_refused_by_name(llm, goldens, params, named):
    prompt = TokensPrompt(prompt_token_ids=goldens[0]["prompt_ids"])
    with pytest.raises(Exception, match=named):
        llm.generate([prompt], SamplingParams(max_tokens=4, **params))


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
        (dict(dtype="bfloat16"), "dtype"),
        (dict(block_size=32), "block_size"),
        (dict(max_model_len=4096), "max_model_len"),
        (dict(max_num_seqs=3), "max_num_seqs"),
        (dict(num_gpu_blocks_override=7), "num_gpu_blocks_override"),
        (dict(tensor_parallel_size=3), "tensor_parallel_size"),
        (dict(enable_lora=True), "LoRA"),
        (
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
            "speculative decoding",
        ),
    ],
)
def test_what_the_artifact_cannot_honour_is_refused_at_start_up(hf_dir, kwargs, named):
    with pytest.raises(Exception, match=named):
        LLM(model=hf_dir, **kwargs)


def test_a_config_that_disagrees_with_the_manifest_is_refused_by_field(hf_dir):
    # The artifact hard-linked file by file (the loader refuses symbolic links out of it), with
    # one field of its config.json changed.
    artifact = Path(hf_dir).parent
    copy = artifact.parent / "disagreeing-config"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(artifact, copy, copy_function=os.link)
    config_path = copy / "tokenizer" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.unlink()
    config["num_hidden_layers"] += 1
    config_path.write_text(json.dumps(config))
    try:
        with pytest.raises(Exception, match="num_hidden_layers"):
            LLM(model=str(copy / "tokenizer"))
    finally:
        shutil.rmtree(copy, ignore_errors=True)
