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
        ladder,
        force: false,
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
    LadderOptions {
        max_batch: 2,
        max_context: 128,
        block_size: 16,
        num_blocks: 1 + 2 * 128 / 16,
        prefill_chunks: vec![16],
        ..LadderOptions::default()
    }
}

fn check_tiny(model: &str) {
    let dir = export_to(
        &support::fixture(model),
        &format!("forward-{model}"),
        Dtype::F32,
        tiny_ladder(),
    );
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
fn tiny_llama3_rope_matches_transformers() {
    check_tiny("tiny-llama3-rope");
}

#[test]
fn tiny_linear_rope_matches_transformers() {
    check_tiny("tiny-llama-linear-rope");
}

/// Pool bytes that differ between `before` and `after`, as `(pool, slot)` pairs.
fn changed_slots(before: &[Vec<u8>], after: &[Vec<u8>], slot_bytes: usize) -> Vec<(usize, usize)> {
    let mut changed = Vec::new();
    for (pool, (b, a)) in before.iter().zip(after).enumerate() {
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
    let dir = export_to(
        &support::fixture("tiny-llama-gqa"),
        "forward-padding",
        Dtype::F32,
        tiny_ladder(),
    );
    let ladder = tiny_ladder().ladder().unwrap();
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let mut runner = Runner::new(&dir, &plugin);
        // A byte pattern that no K/V write reproduces by chance, so a stray write shows.
        runner.fill_pools(|i| (i * 7 + 3) as u8);
        let slot_bytes = runner.slot_bytes();
        let num_layers = runner.artifact.manifest().kv_cache.num_layers;

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
        let expected: Vec<(usize, usize)> = (0..2 * num_layers)
            .flat_map(|pool| (0..prompt.len()).map(move |p| (pool, p)))
            .map(|(pool, p)| (pool, runner.slot_of(&seq, p)))
            .collect();
        let mut changed = changed_slots(&before, &after, slot_bytes);
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
        let expected: Vec<(usize, usize)> = (0..2 * num_layers).map(|pool| (pool, slot)).collect();
        assert_eq!(
            changed_slots(&before, &after, slot_bytes),
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
    let dir = export_to(
        &support::fixture("tiny-llama-gqa"),
        "forward-refusal",
        Dtype::F32,
        tiny_ladder(),
    );
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
    LadderOptions {
        max_batch: 1,
        max_context: 128,
        block_size: 16,
        num_blocks: 1 + 128 / 16,
        prefill_chunks: vec![64],
        ..LadderOptions::default()
    }
}

/// The f32 export reproduces transformers' prompt logits and greedy ids for every golden case;
/// the bf16 export agrees with the f32 one on greedy ids for a sane prefix of each.
#[test]
fn smollm2_f32_matches_transformers_and_bf16_agrees() {
    let gguf = support::smollm2_gguf();
    // The two exports run side by side; each reads the GGUF on its own.
    let (f32_dir, bf16_dir) = std::thread::scope(|s| {
        let bf16 =
            s.spawn(|| export_to(&gguf, "forward-smollm2-bf16", Dtype::Bf16, smollm2_ladder()));
        let f32 = export_to(&gguf, "forward-smollm2-f32", Dtype::F32, smollm2_ladder());
        (f32, bf16.join().unwrap())
    });
    let cases = goldens("SmolLM2-135M-Instruct");
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let start = std::time::Instant::now();
        let mut f32_runner = Runner::new(&f32_dir, &plugin);
        let mut bf16_runner = Runner::new(&bf16_dir, &plugin);
        eprintln!(
            "loaded both artifacts on {} in {:.2?}",
            plugin.display(),
            start.elapsed()
        );
        let mut full_agreement = 0;
        for case in &cases {
            let n = case.greedy_ids.len();
            let start = std::time::Instant::now();
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

            let f32_time = start.elapsed();
            let start = std::time::Instant::now();
            let (bf16_ids, _) = bf16_runner.greedy(&[&case.prompt_ids], n).remove(0);
            eprintln!(
                "  prefill {} + {} decode steps: f32 {f32_time:.2?}, bf16 {:.2?} (compiles included on first use)",
                case.prompt_ids.len(),
                n - 1,
                start.elapsed()
            );
            let agree = ids
                .iter()
                .zip(&bf16_ids)
                .take_while(|(a, b)| a == b)
                .count();
            eprintln!("SmolLM2 bf16 vs f32 {}: agree {agree}/{n}", case.name);
            assert!(
                agree >= 4,
                "{}: bf16 agrees for only {agree} tokens",
                case.name
            );
            if agree == n {
                full_agreement += 1;
            }
        }
        assert!(full_agreement >= 1, "bf16 agrees fully on no prompt");
        for (name, t) in f32_runner
            .compile_times
            .iter()
            .chain(&bf16_runner.compile_times)
        {
            eprintln!("compile {name} on {}: {t:.2?}", plugin.display());
        }
    }
}
