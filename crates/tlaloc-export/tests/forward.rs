//! Exported forward programs run on every test plugin against transformers goldens, and the
//! exact-equality invariants of the paged KV pools.

mod support;

use std::path::{Path, PathBuf};

use support::{Row, Runner, Sequence, goldens, max_relative_error};
use tlaloc_artifact::{Dtype, LadderError, LadderOptions};
use tlaloc_export::{ExportOptions, export};

/// Logits tolerance against transformers: `max |ours - golden| / max |golden|` over the vocab.
const LOGITS_REL_TOL: f64 = 1e-4;
/// Greedy ids are compared up to the first golden step whose top-1/top-2 margin is below this.
const MIN_MARGIN: f64 = 1e-3;

fn export_to(checkpoint: &Path, name: &str, dtype: Dtype, ladder: LadderOptions) -> PathBuf {
    let out = support::scratch_dir(name);
    let options = ExportOptions {
        dtype,
        kv_dtype: None,
        ladder,
        force: false,
        cpu_variant: false,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    };
    let start = std::time::Instant::now();
    let summary = export(checkpoint, &out, &options, &mut |_| {})
        .unwrap_or_else(|e| panic!("exporting {}: {e}", checkpoint.display()));
    eprintln!(
        "exported {name}: {} entries, {} bodies, {} weight bytes, {} body bytes in {:.2?}",
        summary.entries,
        summary.bodies,
        summary.weight_bytes,
        summary.body_bytes,
        start.elapsed()
    );
    out
}

/// Batch up to 2, one context bucket of 128 in blocks of 16, prefill chunks of 16 tokens.
fn tiny_ladder() -> LadderOptions {
    LadderOptions::full_pool(2, 128, 16, vec![16])
}

/// The fixture `model` exported in f32 with [`tiny_ladder`] to the scratch directory `name`.
fn export_tiny(model: &str, name: &str) -> PathBuf {
    export_to(&support::fixture(model), name, Dtype::F32, tiny_ladder())
}

fn check_tiny(model: &str) {
    let dir = export_tiny(model, &format!("forward-{model}"));
    let cases = goldens(model);
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let mut runner = Runner::new(&dir, &plugin);
        // Two cases decode together in one batch; the last alone (a batch-1 entry).
        for group in cases.chunks(2) {
            let prompts: Vec<&[i32]> = group.iter().map(|c| c.prompt_ids.as_slice()).collect();
            let new_tokens = group[0].greedy_ids.len();
            let results = runner.greedy(&prompts, new_tokens);
            for (case, (ids, logits)) in group.iter().zip(results) {
                let err = max_relative_error(&logits, &case.prompt_last_logits);
                eprintln!(
                    "{model}/{} on {}: logits rel err {err:.2e}, ids {:?}",
                    case.name,
                    plugin.display(),
                    ids
                );
                assert!(
                    err <= LOGITS_REL_TOL,
                    "{model}/{}: prompt logits rel err {err:e} > {LOGITS_REL_TOL:e}",
                    case.name
                );
                let n = case.comparable_steps(MIN_MARGIN);
                assert_eq!(
                    ids[..n],
                    case.greedy_ids[..n],
                    "{model}/{}: greedy ids differ from transformers",
                    case.name
                );
            }
        }
    }
}

#[test]
fn tiny_llama_gqa_matches_transformers() {
    check_tiny("tiny-llama-gqa");
}

#[test]
fn tiny_llama_tied_matches_transformers() {
    check_tiny("tiny-llama-tied");
}

#[test]
fn tiny_qwen2_bias_matches_transformers() {
    check_tiny("tiny-qwen2-bias");
}

#[test]
fn tiny_qwen3_qk_norm_matches_transformers() {
    check_tiny("tiny-qwen3-qknorm");
}

#[test]
fn tiny_mistral_sliding_window_matches_transformers() {
    check_tiny("tiny-mistral-window");
}

#[test]
fn tiny_phi3_fused_matches_transformers() {
    check_tiny("tiny-phi3-fused");
}

#[test]
fn tiny_gemma3_matches_transformers() {
    check_tiny("tiny-gemma3");
}

/// The window decides the Mistral fixture's logits: the same checkpoint with `sliding_window`
/// removed from its config (full causal attention) misses the golden on every case whose
/// prompt is longer than the window.
#[test]
fn tiny_mistral_without_its_window_misses_the_golden() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = support::fixture("tiny-mistral-window");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = tmp.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["sliding_window"] = serde_json::Value::Null;
    std::fs::write(&config_path, config.to_string()).unwrap();
    let dir = export_to(
        tmp.path(),
        "forward-mistral-no-window",
        Dtype::F32,
        tiny_ladder(),
    );
    let window = 8;
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let mut runner = Runner::new(&dir, &plugin);
        for case in goldens("tiny-mistral-window") {
            let new_tokens = case.greedy_ids.len();
            let (ids, logits) = runner.greedy(&[&case.prompt_ids], new_tokens).remove(0);
            let err = max_relative_error(&logits, &case.prompt_last_logits);
            eprintln!(
                "no window, {} ({} prompt tokens) on {}: logits rel err {err:.2e}, ids {ids:?}",
                case.name,
                case.prompt_ids.len(),
                plugin.display()
            );
            if case.prompt_ids.len() > window {
                assert!(
                    err > 100.0 * LOGITS_REL_TOL,
                    "{}: full attention matches the windowed golden (rel err {err:e})",
                    case.name
                );
            } else {
                // The prompt fits in the window: its logits agree, and the chain parts from
                // the golden's once the sequence outgrows the window.
                assert!(err <= LOGITS_REL_TOL, "{}: rel err {err:e}", case.name);
                assert_eq!(
                    ids[..window - case.prompt_ids.len()],
                    case.greedy_ids[..window - case.prompt_ids.len()]
                );
                assert_ne!(
                    ids, case.greedy_ids,
                    "{}: full attention reproduces the windowed chain",
                    case.name
                );
            }
        }
    }
}

#[test]
fn tiny_llama3_rope_matches_transformers() {
    check_tiny("tiny-llama3-rope");
}

#[test]
fn tiny_linear_rope_matches_transformers() {
    check_tiny("tiny-llama-linear-rope");
}

/// Pool bytes that differ between `before` and `after`, as `(pool, slot)` pairs; pool `i`'s
/// slots are `slot_bytes[i]` bytes.
fn changed_slots(
    before: &[Vec<u8>],
    after: &[Vec<u8>],
    slot_bytes: &[usize],
) -> Vec<(usize, usize)> {
    let mut changed = Vec::new();
    for (pool, (b, a)) in before.iter().zip(after).enumerate() {
        let slot_bytes = slot_bytes[pool];
        for (slot, (x, y)) in b
            .chunks_exact(slot_bytes)
            .zip(a.chunks_exact(slot_bytes))
            .enumerate()
        {
            if x != y {
                changed.push((pool, slot));
            }
        }
    }
    changed
}

/// A dead row and padded prefill tokens write nothing; every slot no sequence wrote in this
/// step is bit-identical before and after it (pools read back and compared byte for byte).
#[test]
fn padding_writes_nothing_and_unowned_slots_are_untouched() {
    let dir = export_tiny("tiny-llama-gqa", "forward-padding");
    check_padding_and_unowned_slots(&dir, &tlaloc_pjrt::testing::test_plugin_paths());
}

/// The same for int8 pools: codes and scales alike, every pool operand of the contract.
#[test]
fn int8_padding_writes_nothing_and_unowned_slots_are_untouched() {
    let dir = export_tiny_kv("tiny-llama-gqa", "forward-padding-int8", Dtype::I8);
    check_padding_and_unowned_slots(&dir, &tlaloc_pjrt::testing::test_plugin_paths());
}

/// The same for fp8 e4m3 pools (both CPU plugins run the type).
#[test]
fn fp8_padding_writes_nothing_and_unowned_slots_are_untouched() {
    let dir = export_tiny_kv("tiny-llama-gqa", "forward-padding-fp8", Dtype::F8E4M3FN);
    check_padding_and_unowned_slots(&dir, &tlaloc_pjrt::testing::test_plugin_paths());
}

/// The fixture `model` exported in f32 with [`tiny_ladder`] and K/V pools of `kv_dtype`.
fn export_tiny_kv(model: &str, name: &str, kv_dtype: Dtype) -> PathBuf {
    let out = support::scratch_dir(name);
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: Some(kv_dtype),
        ladder: tiny_ladder(),
        force: false,
        cpu_variant: false,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    };
    export(support::fixture(model), &out, &options, &mut |_| {})
        .unwrap_or_else(|e| panic!("exporting {model} with {kv_dtype} pools: {e}"));
    out
}

fn check_padding_and_unowned_slots(dir: &Path, plugins: &[PathBuf]) {
    let ladder = tiny_ladder().ladder().unwrap();
    for plugin in plugins {
        let mut runner = Runner::new(dir, plugin);
        // A byte pattern that no K/V write reproduces by chance, so a stray write shows.
        runner.fill_pools(|i| (i * 7 + 3) as u8);
        let slot_bytes = runner.slot_bytes();
        let num_pools = runner.pool_operands().len();

        // Prefill 5 tokens through a 16-token chunk: 11 padded tokens.
        let prompt = [5, 17, 300, 42, 9];
        let mut seq = Sequence::default();
        runner.reserve(&mut seq, prompt.len());
        let before = runner.read_pools();
        let point = ladder.prefill_entry(prompt.len(), prompt.len()).unwrap();
        assert_eq!(point.tokens, 16);
        runner.run(
            point,
            &[Row {
                seq: &seq,
                tokens: &prompt,
            }],
        );
        seq.len = prompt.len();
        let after = runner.read_pools();
        let expected: Vec<(usize, usize)> = (0..num_pools)
            .flat_map(|pool| (0..prompt.len()).map(move |p| (pool, p)))
            .map(|(pool, p)| (pool, runner.slot_of(&seq, p)))
            .collect();
        let mut changed = changed_slots(&before, &after, &slot_bytes);
        changed.sort();
        let mut expected_sorted = expected.clone();
        expected_sorted.sort();
        assert_eq!(changed, expected_sorted, "prefill with padded tokens");

        // Decode one token for the sequence in a batch-2 entry whose second row is dead.
        let grown = seq.len + 1;
        runner.reserve(&mut seq, grown);
        let before = runner.read_pools();
        let point = ladder.decode_entry(2, seq.len + 1).unwrap();
        assert_eq!(point.batch, 2);
        runner.run(
            point,
            &[Row {
                seq: &seq,
                tokens: &[77],
            }],
        );
        let after = runner.read_pools();
        let slot = runner.slot_of(&seq, seq.len);
        let expected: Vec<(usize, usize)> = (0..num_pools).map(|pool| (pool, slot)).collect();
        assert_eq!(
            changed_slots(&before, &after, &slot_bytes),
            expected,
            "decode with a dead row"
        );
        // The scratch page (block 0) is among the untouched slots: nothing wrote there either.
        assert!(expected.iter().all(|&(_, s)| s >= runner.block_size()));
    }
}

/// A prompt longer than the top context bucket is refused by name before anything runs.
#[test]
fn prompt_past_top_context_is_refused() {
    let dir = export_tiny("tiny-llama-gqa", "forward-refusal");
    let plugin = tlaloc_pjrt::testing::test_plugin_paths().remove(0);
    let mut runner = Runner::new(&dir, &plugin);
    let prompt = vec![1i32; 129];
    let err = runner.prefill(&prompt).unwrap_err();
    assert_eq!(
        err,
        LadderError::ContextTooLong {
            requested: 129,
            max: 128
        }
    );
    assert!(
        err.to_string()
            .contains("exceeds the largest context bucket 128")
    );
}

/// SmolLM2's ladder for the tests: batch 1, one context bucket of 128, one prefill chunk of 64.
fn smollm2_ladder() -> LadderOptions {
    LadderOptions::full_pool(1, 128, 16, vec![64])
}

/// The SmolLM2 f32 and bf16 exports, made once for every test of this binary that needs them
/// (the two run side by side; each reads the GGUF on its own).
fn smollm2_exports() -> &'static (PathBuf, PathBuf) {
    static EXPORTS: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    EXPORTS.get_or_init(|| {
        let gguf = support::smollm2_gguf();
        std::thread::scope(|s| {
            let bf16 =
                s.spawn(|| export_to(&gguf, "forward-smollm2-bf16", Dtype::Bf16, smollm2_ladder()));
            let f32 = export_to(&gguf, "forward-smollm2-f32", Dtype::F32, smollm2_ladder());
            (f32, bf16.join().unwrap())
        })
    })
}

/// The f32 export reproduces transformers' prompt logits and greedy ids for every golden case;
/// the bf16 export passes [`bf16_agreement`] against the same goldens.
#[test]
fn smollm2_f32_matches_transformers_and_bf16_agrees() {
    let (f32_dir, bf16_dir) = smollm2_exports();
    let cases = goldens("SmolLM2-135M-Instruct");
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let start = std::time::Instant::now();
        let mut f32_runner = Runner::new(f32_dir, &plugin);
        let mut bf16_runner = Runner::new(bf16_dir, &plugin);
        eprintln!(
            "loaded both artifacts on {} in {:.2?}",
            plugin.display(),
            start.elapsed()
        );
        for case in &cases {
            let n = case.greedy_ids.len();
            let (ids, logits) = f32_runner.greedy(&[&case.prompt_ids], n).remove(0);
            let err = max_relative_error(&logits, &case.prompt_last_logits);
            let steps = case.comparable_steps(MIN_MARGIN);
            eprintln!(
                "SmolLM2 f32 {} on {}: logits rel err {err:.2e}, ids match {}/{n} (compared {steps})",
                case.name,
                plugin.display(),
                ids.iter()
                    .zip(&case.greedy_ids)
                    .take_while(|(a, b)| a == b)
                    .count()
            );
            assert!(
                err <= LOGITS_REL_TOL,
                "{}: prompt logits rel err {err:e} > {LOGITS_REL_TOL:e}",
                case.name
            );
            assert_eq!(ids[..steps], case.greedy_ids[..steps], "{}", case.name);
        }
        let report = bf16_agreement(&mut bf16_runner, &cases)
            .unwrap_or_else(|e| panic!("bf16 on {}: {e}", plugin.display()));
        eprintln!("SmolLM2 bf16 on {}: {report}", plugin.display());
        for (name, t) in f32_runner
            .compile_times
            .iter()
            .chain(&bf16_runner.compile_times)
        {
            eprintln!("compile {name} on {}: {t:.2?}", plugin.display());
        }
    }
}

/// Gemma 3 270M (Q4_K_M, dequantized to f32) reproduces transformers' prompt logits and greedy
/// ids on every golden case, the last of them a 633-token prompt that outgrows the 512-token
/// window of its sliding layers. Its SentencePiece vocabulary is not rebuilt from the GGUF, so
/// the artifact takes token ids. The bf16 export passes [`bf16_agreement`] against the same
/// goldens.
#[test]
fn gemma3_270m_f32_matches_transformers_and_bf16_agrees() {
    let checkpoint =
        tlaloc_export::Checkpoint::open_gguf_token_ids_only(support::gemma3_gguf()).unwrap();
    let out = support::scratch_dir("forward-gemma3-270m-f32");
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: None,
        ladder: LadderOptions::full_pool(1, 1024, 16, vec![128]),
        force: false,
        cpu_variant: false,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    };
    tlaloc_export::export_checkpoint(&checkpoint, &out, &options, &mut |_| {}).unwrap();
    let bf16_out = support::scratch_dir("forward-gemma3-270m-bf16");
    let bf16_options = ExportOptions {
        dtype: Dtype::Bf16,
        ..options
    };
    tlaloc_export::export_checkpoint(&checkpoint, &bf16_out, &bf16_options, &mut |_| {}).unwrap();
    drop(checkpoint);
    let cases = goldens("gemma-3-270m");
    assert!(cases.last().unwrap().prompt_ids.len() > 512);
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let mut runner = Runner::new(&out, &plugin);
        for case in &cases {
            let n = case.greedy_ids.len();
            let (ids, logits) = runner.greedy(&[&case.prompt_ids], n).remove(0);
            let err = max_relative_error(&logits, &case.prompt_last_logits);
            let steps = case.comparable_steps(MIN_MARGIN);
            eprintln!(
                "Gemma 3 270M {} ({} prompt tokens) on {}: logits rel err {err:.2e}, ids {ids:?} \
                 (compared {steps})",
                case.name,
                case.prompt_ids.len(),
                plugin.display()
            );
            assert!(
                err <= LOGITS_REL_TOL,
                "{}: prompt logits rel err {err:e} > {LOGITS_REL_TOL:e}",
                case.name
            );
            assert_eq!(ids[..steps], case.greedy_ids[..steps], "{}", case.name);
        }
        let mut bf16_runner = Runner::new(&bf16_out, &plugin);
        let report = bf16_agreement(&mut bf16_runner, &cases)
            .unwrap_or_else(|e| panic!("Gemma 3 270M bf16 on {}: {e}", plugin.display()));
        eprintln!("Gemma 3 270M bf16 on {}: {report}", plugin.display());
    }
}

/// bf16's unit roundoff: 8 significand bits, so round-to-nearest is off by at most 2^-8.
const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// How far a bf16 export's logits may be from the f32 golden's, as a multiple of one bf16
/// rounding of the logit (`BF16_UNIT_ROUNDOFF * |logit|`), for a model of `num_layers` layers.
///
/// The bf16 body rounds, per layer, the inputs of its three matrix products per attention
/// block and three per MLP, the two attention dots' narrowed operands, the K and V rows
/// written to the pools, and the seven weight matrices (q, k, v, o, gate, up, down): about
/// 16 roundings, plus two for the LM head. A round-to-nearest error is at most `u` relative
/// and, spread evenly over `[-u, u]`, has an RMS of `u / sqrt(3)`; `R` independent ones add in
/// quadrature to `u * sqrt(R / 3)`. That is the error the stream would carry if nothing
/// averaged it; RMSNorm and the residual sums average it down, so the unaveraged RMS is used
/// as the bound on every single logit.
fn bf16_error_units(num_layers: usize) -> f64 {
    ((16 * num_layers + 2) as f64 / 3.0).sqrt()
}

/// What [`bf16_agreement`] compared.
#[derive(Debug)]
struct Bf16Report {
    /// Steps whose golden margin exceeds twice the bound, where bf16 must pick the same token.
    decided: usize,
    /// Decided steps where bf16 picked another token.
    disagreed: usize,
    steps: usize,
    /// The largest logit error seen, as a fraction of the allowed bound.
    worst_error_fraction: f64,
}

impl std::fmt::Display for Bf16Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "same token on {} of the {} of {} steps whose margin exceeds twice the bound; \
             largest logit error {:.0}% of the bound",
            self.decided - self.disagreed,
            self.decided,
            self.steps,
            100.0 * self.worst_error_fraction
        )
    }
}

/// Runs every golden case through a bf16 runner with the golden's own continuation forced
/// (teacher forcing) and checks, at every step `i`:
///
/// - each of the golden's top logits is matched within `eps_i = units * u * s_i`, where `s_i`
///   is the magnitude of the golden's top logit at that step and `units` comes from
///   [`bf16_error_units`] (the whole vocabulary is checked the same way at the prompt);
/// - where the golden's top-1/top-2 margin exceeds `2 * eps_i`, no error within the bound can
///   reorder the two, so the program's own greedy token must be the golden's.
///
/// Steps with a smaller margin are a property of the machine's rounding, not of correctness,
/// and decide nothing; forcing keeps one such step from deciding the steps after it.
fn bf16_agreement(
    runner: &mut Runner,
    cases: &[support::GoldenCase],
) -> Result<Bf16Report, String> {
    let units = bf16_error_units(runner.artifact.manifest().kv_cache.num_layers);
    let mut report = Bf16Report {
        decided: 0,
        disagreed: 0,
        steps: 0,
        worst_error_fraction: 0.0,
    };
    // Every violation is collected, so a failure says how widespread it is.
    let mut violations = Vec::new();
    for case in cases {
        let steps = runner.forced_steps(&case.prompt_ids, &case.greedy_ids);
        let prompt_err = max_relative_error(&steps[0].logits, &case.prompt_last_logits);
        let prompt_bound = units * BF16_UNIT_ROUNDOFF;
        report.worst_error_fraction = report.worst_error_fraction.max(prompt_err / prompt_bound);
        if prompt_err > prompt_bound {
            violations.push(format!(
                "{}: prompt logits rel err {prompt_err:.3e} > {prompt_bound:.3e}",
                case.name
            ));
        }
        for (i, step) in steps.iter().enumerate() {
            let top = &case.top_logits[i];
            let scale = top[0].1.abs().max(top[1].1.abs());
            let eps = units * BF16_UNIT_ROUNDOFF * scale;
            for &(id, golden) in top {
                let err = (f64::from(step.logits[id as usize]) - golden).abs();
                report.worst_error_fraction = report.worst_error_fraction.max(err / eps);
                if err > eps {
                    violations.push(format!(
                        "{} step {i}: logit of token {id} is off by {err:.3} > bound {eps:.3} \
                         (golden {golden:.3})",
                        case.name
                    ));
                }
            }
            report.steps += 1;
            if case.margins[i] > 2.0 * eps {
                report.decided += 1;
                if step.next_token != case.greedy_ids[i] {
                    report.disagreed += 1;
                    violations.push(format!(
                        "{} step {i}: bf16 picks {} where the golden picks {} by a margin of \
                         {:.3} > {:.3}",
                        case.name,
                        step.next_token,
                        case.greedy_ids[i],
                        case.margins[i],
                        2.0 * eps
                    ));
                }
            }
        }
    }
    if violations.is_empty() {
        return Ok(report);
    }
    Err(format!(
        "{} violations over {} steps ({report}); first: {}",
        violations.len(),
        report.steps,
        violations[..violations.len().min(3)].join("; ")
    ))
}

/// The bf16 rule catches a real bf16 bug: the bf16 export with its RoPE tables built for the
/// Llama default base (10,000) instead of SmolLM2's own (100,000) fails it.
#[test]
fn bf16_agreement_catches_a_wrong_rope_table() {
    let (_, bf16_dir) = smollm2_exports();
    let cases = goldens("SmolLM2-135M-Instruct");
    let plugin = tlaloc_pjrt::testing::test_plugin_paths().remove(0);
    let mut runner = Runner::new(bf16_dir, &plugin);
    let manifest = runner.artifact.manifest().clone();
    let dims = &manifest
        .weight(tlaloc_export::graph::ROPE_COS_SLOT)
        .expect("a cos table")
        .dims;
    let (positions, head_dim) = (dims[0], dims[1]);
    let (cos, sin) = tlaloc_export::graph::rope::tables(
        10_000.0,
        head_dim,
        &tlaloc_export::RopeScaling::None,
        positions,
    );
    let bytes = |t: &[f32]| t.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    runner.replace_weight(tlaloc_export::graph::ROPE_COS_SLOT, &bytes(&cos));
    runner.replace_weight(tlaloc_export::graph::ROPE_SIN_SLOT, &bytes(&sin));
    let err =
        bf16_agreement(&mut runner, &cases).expect_err("a wrong RoPE base must fail the bf16 rule");
    eprintln!("planted RoPE bug on {}: {err}", plugin.display());
}
