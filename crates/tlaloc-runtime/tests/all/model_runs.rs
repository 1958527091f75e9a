//! The PJRT-backed model on every test plugin, over the toy artifact.

use std::path::{Path, PathBuf};

use tlaloc_pjrt::XlaOptionValue;
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::scheduler::Scheduler;
use tlaloc_runtime::{
    CompileMode, Engine, EngineHandle, EntryKind, GenerateRequest, LadderPoint, LoadOptions, Model,
    ModelExecutor, SamplingParams, StepInputs,
};

use crate::streams::{submit_greedy, try_collect_ids};
use crate::toy::{self, BLOCK_SIZE, reference_generate};

/// Load options for `plugin` (artifact verified, compile cache as given).
pub fn options(plugin: &Path, cache: Option<PathBuf>, compile: CompileMode) -> LoadOptions {
    LoadOptions {
        plugin: PluginRequest::Path(plugin.to_owned()),
        verify: true,
        compile,
        compile_cache: cache,
        ..LoadOptions::default()
    }
}

fn prompts() -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            (0..(1 + 2 * i))
                .map(|k| (k * 11 + i * 5 + 1) % toy::VOCAB as u32)
                .collect()
        })
        .collect()
}

/// Submits [`prompts`] greedily, prompt `i` for `budget(i)` new tokens, and checks every
/// stream's ids against the toy reference.
fn assert_prompts_match_the_reference(
    engine: &EngineHandle,
    plugin: &Path,
    budget: impl Fn(usize) -> usize,
) {
    let streams = submit_greedy(engine, prompts(), &budget);
    for (n, (p, events)) in prompts().iter().zip(streams).enumerate() {
        let (ids, _) = try_collect_ids(events)
            .unwrap_or_else(|m| panic!("{}: prompt {n}: {m}", plugin.display()));
        assert_eq!(
            ids,
            reference_generate(p, budget(n)),
            "{}: prompt {n}",
            plugin.display()
        );
    }
}

/// Starts an engine on `model` and checks one greedy generation of `prompt` against the
/// reference.
fn generates_the_reference(model: Model, prompt: &[u32], max_tokens: usize) {
    let engine = Engine::start(model).unwrap();
    let got = engine
        .generate_blocking(GenerateRequest::greedy(prompt.to_vec(), max_tokens))
        .unwrap();
    assert_eq!(got.token_ids, reference_generate(prompt, max_tokens));
    engine.shutdown();
}

#[test]
fn eight_prompts_batched_and_preempted_match_the_reference_on_every_plugin() {
    // 15 allocatable pages of 4 tokens for eight sequences of up to 31 tokens: preemption.
    let (_tmp, dir) = toy::temp(16);
    for plugin in test_plugin_paths() {
        let engine = Engine::load(&dir, options(&plugin, None, CompileMode::Eager))
            .unwrap_or_else(|e| panic!("loading the toy artifact on {}: {e}", plugin.display()));
        let max_tokens = 16;
        assert_prompts_match_the_reference(&engine, &plugin, |_| max_tokens);
        let stats = engine.stats();
        assert!(
            stats.preemptions_total > 0,
            "{}: no preemption: {stats:?}",
            plugin.display()
        );
        assert!(
            stats.steps.decode_rows > stats.steps.decode_steps,
            "{stats:?}"
        );
        assert_eq!(stats.kv_pages_used, 0);
        let per_step = |t: tlaloc_runtime::StepTimings, n: u64| {
            let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
            format!(
                "build {:.0} µs, upload {:.0} µs, execute {:.0} µs, readback {:.0} µs, other {:.0} µs",
                us(t.build),
                us(t.upload),
                us(t.execute),
                us(t.readback),
                us(t.other)
            )
        };
        eprintln!(
            "{}: {} decode steps ({} rows): {}; {} prefill steps: {}",
            plugin.display(),
            stats.steps.decode_steps,
            stats.steps.decode_rows,
            per_step(stats.steps.decode_time, stats.steps.decode_steps),
            stats.steps.prefill_steps,
            per_step(stats.steps.prefill_time, stats.steps.prefill_steps)
        );

        // Sampling reads the logits back; at temperature 1e-3 the argmax of -|v - next| wins.
        let cold = engine
            .generate_blocking(GenerateRequest {
                sampling: SamplingParams {
                    temperature: 1e-3,
                    seed: Some(1),
                    ..SamplingParams::greedy()
                },
                logprobs: Some(1),
                ..GenerateRequest::greedy(prompts()[5].clone(), 8)
            })
            .unwrap();
        assert_eq!(
            cold.token_ids,
            reference_generate(&prompts()[5], 8),
            "{}",
            plugin.display()
        );
        engine.shutdown();
    }
}

#[test]
fn the_compile_cache_serves_a_second_start_with_the_same_results() {
    let (tmp, dir) = toy::temp(32);
    for plugin in test_plugin_paths() {
        let cache = tmp.path().join(format!(
            "cache-{}",
            plugin.file_name().unwrap().to_string_lossy()
        ));
        let cold = Model::load(
            &dir,
            &options(&plugin, Some(cache.clone()), CompileMode::Eager),
        )
        .unwrap();
        let cold_timings = cold.load_timings().unwrap();
        let entries = cold.shape().ladder.points().len();
        assert_eq!(
            (cold_timings.compiled, cold_timings.cache_hits),
            (entries, 0)
        );
        drop(cold);
        let warm = Model::load(&dir, &options(&plugin, Some(cache), CompileMode::Eager)).unwrap();
        let warm_timings = warm.load_timings().unwrap();
        assert_eq!(
            (warm_timings.compiled, warm_timings.cache_hits),
            (0, entries),
            "{}",
            plugin.display()
        );
        eprintln!(
            "{}: start-up compile {:?} without the cache, {:?} with it ({entries} entries)",
            plugin.display(),
            cold_timings.compile,
            warm_timings.compile
        );
        generates_the_reference(warm, &prompts()[6], 10);
    }
}

#[test]
fn xla_options_reach_every_compile_and_key_the_compile_cache() {
    let (tmp, dir) = toy::temp(32);
    for plugin in test_plugin_paths() {
        let name = plugin.file_name().unwrap().to_string_lossy().into_owned();
        let cache = tmp.path().join(format!("cache-{name}"));
        let dumps = tmp.path().join(format!("dump-{name}"));
        let plain = Model::load(
            &dir,
            &options(&plugin, Some(cache.clone()), CompileMode::Eager),
        )
        .unwrap();
        let entries = plain.shape().ladder.points().len();
        drop(plain);

        // Same artifact and cache, one XLA option more: every entry compiles again (the option
        // is in the key), under the option (XLA dumps each module there).
        let mut with_option = options(&plugin, Some(cache), CompileMode::Eager);
        with_option.xla_options.insert(
            "xla_dump_to".into(),
            XlaOptionValue::String(dumps.to_str().expect("utf-8 temp path").into()),
        );
        let dumped = Model::load(&dir, &with_option).unwrap();
        let timings = dumped.load_timings().unwrap();
        assert_eq!(
            (timings.compiled, timings.cache_hits),
            (entries, 0),
            "{}",
            plugin.display()
        );
        let modules = std::fs::read_dir(&dumps)
            .map(|d| d.count())
            .unwrap_or_default();
        assert!(
            modules >= entries,
            "{}: {modules} dump files",
            plugin.display()
        );
        generates_the_reference(dumped, &prompts()[4], 6);
    }
}

#[test]
fn lazy_compilation_defers_every_entry_and_still_generates() {
    let (_tmp, dir) = toy::temp(32);
    for plugin in test_plugin_paths() {
        let model = Model::load(&dir, &options(&plugin, None, CompileMode::Lazy)).unwrap();
        let timings = model.load_timings().unwrap();
        assert_eq!(timings.compiled + timings.cache_hits, 0);
        assert_eq!(timings.deferred, model.shape().ladder.points().len());
        generates_the_reference(model, &prompts()[7], 12);
    }
}

#[test]
fn padded_rows_write_nothing_and_unowned_slots_stay_bit_identical() {
    let (_tmp, dir) = toy::temp(32);
    for plugin in test_plugin_paths() {
        let mut model = Model::load(&dir, &options(&plugin, None, CompileMode::Eager)).unwrap();
        let mut scheduler = Scheduler::new(model.shape()).unwrap();
        // One real sequence through prefill, then a decode step on a B=4 entry (3 padded rows).
        scheduler
            .add(1, GenerateRequest::greedy(vec![3, 1, 4, 1, 5], 4))
            .unwrap();
        let prefill = scheduler.schedule().unwrap().unwrap();
        let out = model.step(&prefill.entry, &prefill.inputs).unwrap();
        scheduler.complete(&prefill, &out).unwrap();
        let before: Vec<Vec<u8>> = (0..2).map(|i| model.read_pool(i).unwrap()).collect();

        let entry = LadderPoint {
            kind: EntryKind::Decode,
            batch: 4,
            tokens: 1,
            context: 16,
        };
        let live = scheduler.schedule().unwrap().unwrap();
        assert_eq!(live.entry.kind, EntryKind::Decode);
        let cols = 16 / BLOCK_SIZE;
        let mut inputs = StepInputs {
            token_ids: vec![0; 4],
            positions: vec![0; 4],
            block_tables: vec![0; 4 * cols],
            seq_lens: vec![1; 4],
            slot_mapping: vec![-1; 4],
            want_logits: true,
        };
        let live_cols = live.entry.context / BLOCK_SIZE;
        inputs.token_ids[0] = live.inputs.token_ids[0];
        inputs.positions[0] = live.inputs.positions[0];
        inputs.seq_lens[0] = live.inputs.seq_lens[0];
        inputs.slot_mapping[0] = live.inputs.slot_mapping[0];
        inputs.block_tables[..live_cols.min(cols)]
            .copy_from_slice(&live.inputs.block_tables[..live_cols.min(cols)]);
        let out = model.step(&entry, &inputs).unwrap();
        let written = live.inputs.slot_mapping[0] as usize;
        for (i, old) in before.iter().enumerate() {
            let new = model.read_pool(i).unwrap();
            for slot in 0..new.len() / 4 {
                let (a, b) = (&old[slot * 4..slot * 4 + 4], &new[slot * 4..slot * 4 + 4]);
                if slot == written {
                    assert_ne!(
                        a,
                        b,
                        "{}: pool {i}: the live slot {slot} was not written",
                        plugin.display()
                    );
                } else {
                    assert_eq!(a, b, "{}: pool {i}: slot {slot} changed", plugin.display());
                }
            }
        }
        // The live row's token is the reference's; the logits came back for all four rows.
        let mut tokens = vec![3, 1, 4, 1, 5];
        tokens.push(toy::reference_next(&tokens));
        assert_eq!(out.next_tokens[0] as u32, toy::reference_next(&tokens));
        assert_eq!(out.logits.as_ref().map(Vec::len), Some(4 * toy::VOCAB));
    }
}

#[test]
fn every_pool_is_zero_after_loading() {
    let (_tmp, dir) = toy::temp(32);
    for plugin in test_plugin_paths() {
        let model = Model::load(&dir, &options(&plugin, None, CompileMode::Lazy)).unwrap();
        // The toy has one layer: pool 0 (K) is uploaded, pool 1 (V) made from it on the device.
        for i in 0..2 {
            let pool = model
                .read_pool(i)
                .unwrap_or_else(|| panic!("{}: pool {i} missing", plugin.display()));
            assert_eq!(pool.len(), 32 * BLOCK_SIZE * 4, "{}", plugin.display());
            assert!(
                pool.iter().all(|&b| b == 0),
                "{}: pool {i} is not zero-filled",
                plugin.display()
            );
        }
        assert!(model.read_pool(2).is_none());
    }
}

#[test]
fn decode_steps_chained_on_the_device_match_the_reference_on_every_plugin() {
    let (_tmp, dir) = toy::temp(64);
    for plugin in test_plugin_paths() {
        // Chains form whatever this machine's step time: the window is an hour, not 20 ms.
        let options = LoadOptions {
            decode_chain_window: std::time::Duration::from_secs(3600),
            ..options(&plugin, None, CompileMode::Eager)
        };
        let engine = Engine::load(&dir, options).unwrap();
        // Budgets that end at different offsets inside a chain of up to eight steps.
        let budget = |i: usize| 2 + 2 * i;
        assert_prompts_match_the_reference(&engine, &plugin, budget);
        let stats = engine.stats();
        assert!(
            stats.steps.decode_chained_steps > 0,
            "{}: nothing chained: {stats:?}",
            plugin.display()
        );
        assert_eq!(stats.kv_pages_used, 0);
        engine.shutdown();
    }
}

/// Regression: with a warm compile cache an edited body (its file name still the old hash) was
/// never read, so the cached code of the original ran and the edit went unnoticed.
#[test]
fn a_warm_compile_cache_does_not_hide_a_tampered_body() {
    let (tmp, dir) = toy::temp(32);
    let plugin = test_plugin_paths().remove(0);
    let cache = tmp.path().join("cache");
    let warm = Model::load(
        &dir,
        &options(&plugin, Some(cache.clone()), CompileMode::Eager),
    );
    drop(warm.unwrap());
    let body = tlaloc_artifact::Artifact::open(&dir)
        .unwrap()
        .manifest()
        .entries[0]
        .body
        .clone();
    let text = std::fs::read_to_string(dir.join(&body)).unwrap();
    let edited = text.replacen("stablehlo.add", "stablehlo.subtract", 1);
    assert_ne!(edited, text, "the toy body has an add to edit");
    std::fs::write(dir.join(&body), edited).unwrap();
    let err = Model::load(&dir, &options(&plugin, Some(cache), CompileMode::Eager)).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&body) && message.contains("sha256"),
        "{message}"
    );
}

#[test]
fn prompts_prefilled_together_match_the_reference_on_every_plugin() {
    // Prefill entries of 1, 2 and 4 prompts, chunks 4 and 8: eight prompts of 1 to 15 tokens
    // share prefill steps, rows of different lengths padded inside one chunk, longer ones
    // continued in the next.
    let (_tmp, dir) = toy::temp_with(64, &[1, 2, 4]);
    for plugin in test_plugin_paths() {
        let engine = Engine::load(&dir, options(&plugin, None, CompileMode::Eager)).unwrap();
        let max_tokens = 6;
        // The prompts are submitted one by one while the engine runs, so on a busy machine a
        // round can prefill each prompt before the next arrives; every round must match the
        // reference, and some round within a few must have shared a prefill step.
        for _ in 0..5 {
            assert_prompts_match_the_reference(&engine, &plugin, |_| max_tokens);
            let steps = engine.stats().steps;
            if steps.prefill_rows > steps.prefill_steps {
                break;
            }
        }
        let stats = engine.stats();
        assert!(
            stats.steps.prefill_rows > stats.steps.prefill_steps,
            "{}: no prompts prefilled together: {stats:?}",
            plugin.display()
        );
        assert_eq!(stats.kv_pages_used, 0);
        engine.shutdown();
    }
}
