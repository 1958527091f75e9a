//! Tensor-parallel artifacts served by the runtime: the tiny fixture (4 heads, 2 KV heads)
//! exported at degree 1 and 2, and SmolLM2 (9 heads, 3 KV heads) at degree 1 and 3, loaded by
//! the engine on every test plugin (degree N on a CPU client of N devices) and decoded greedily:
//! the ids must equal the degree-1 artifact's, one request at a time and two batched together.
//! Both degrees share one compile cache, so a one-device executable served to the SPMD load (or
//! the reverse) would show as a failure here.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use tlaloc_artifact::LadderOptions;
use tlaloc_export::{ExportOptions, export};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::{test_plugin_paths, workspace_root};

use common::scratch;
use tlaloc_runtime::{
    CompileMode, Engine, EngineHandle, EngineOptions, GenerateRequest, LoadOptions, TokenEvent,
};

/// Batches 1 and 2, one context bucket of 128 in blocks of 16, prefill chunks of 16.
fn ladder() -> LadderOptions {
    LadderOptions::full_pool(2, 128, 16, vec![16])
}

fn export_at(checkpoint: &Path, name: &str, tensor_parallel: usize) -> PathBuf {
    let out = scratch(name);
    let options = ExportOptions {
        ladder: ladder(),
        tensor_parallel,
        ..ExportOptions::default()
    };
    let started = Instant::now();
    export(checkpoint, &out, &options, &mut |_| {})
        .unwrap_or_else(|e| panic!("exporting {} to {name}: {e}", checkpoint.display()));
    eprintln!("exported {name} in {:.2?}", started.elapsed());
    out
}

fn load(dir: &Path, plugin: &Path, cache: &Path) -> EngineHandle {
    let started = Instant::now();
    let engine = Engine::load_with_options(
        dir,
        LoadOptions {
            plugin: PluginRequest::Path(plugin.to_owned()),
            compile: CompileMode::Lazy,
            compile_cache: Some(cache.to_owned()),
            ..LoadOptions::default()
        },
        EngineOptions::default(),
    )
    .unwrap_or_else(|e| panic!("loading {} on {}: {e}", dir.display(), plugin.display()));
    eprintln!(
        "loaded {} on {} in {:.2?}",
        dir.display(),
        plugin.display(),
        started.elapsed()
    );
    engine
}

fn greedy(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::greedy(prompt.to_vec(), max_tokens)
    }
}

/// Each prompt's greedy ids run alone, then all prompts' run together (batched rows).
fn greedy_ids(engine: &EngineHandle, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            engine
                .generate_blocking(greedy(p, max_tokens))
                .unwrap_or_else(|e| panic!("generating: {e}"))
                .token_ids
        })
        .collect();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(greedy(p, max_tokens)).unwrap().1)
        .collect();
    for mut events in streams {
        let mut ids = Vec::new();
        loop {
            match events.blocking_recv() {
                Some(TokenEvent::Token { id, .. }) => ids.push(id),
                Some(TokenEvent::Finished { .. }) => break,
                Some(TokenEvent::Error { message }) => panic!("request failed: {message}"),
                None => panic!("a stream ended without Finished"),
            }
        }
        out.push(ids);
    }
    out
}

/// Degree `degree` against degree 1 on every test plugin.
fn degree_matches_one(checkpoint: &Path, name: &str, degree: usize, prompts: &[Vec<u32>]) {
    let one = export_at(checkpoint, &format!("tp-serve-{name}-1"), 1);
    let split = export_at(checkpoint, &format!("tp-serve-{name}-{degree}"), degree);
    let cache = scratch(&format!("tp-serve-{name}-cache"));
    for plugin in test_plugin_paths() {
        let engine = load(&one, &plugin, &cache);
        let expected = greedy_ids(&engine, prompts, 8);
        engine.shutdown();
        // Twice: the second load takes its executables from the compile cache.
        for round in 0..2 {
            let engine = load(&split, &plugin, &cache);
            let got = greedy_ids(&engine, prompts, 8);
            engine.shutdown();
            assert_eq!(
                got,
                expected,
                "{name} at degree {degree} (round {round}) on {}: greedy ids differ from degree 1",
                plugin.display()
            );
        }
        eprintln!(
            "{name}: degree {degree} = degree 1 on {}: {expected:?}",
            plugin.display()
        );
    }
}

#[test]
fn the_tiny_fixture_at_degree_two_generates_the_ids_of_degree_one() {
    let fixture = workspace_root().join("tests/data/fixtures/tiny-llama-tied");
    let prompts = vec![
        vec![1, 5, 9, 13, 17],
        vec![3, 30, 7, 2, 11, 19, 23, 4, 8, 40],
    ];
    degree_matches_one(&fixture, "tiny", 2, &prompts);
}

#[test]
fn smollm2_at_degree_three_generates_the_ids_of_degree_one() {
    let gguf = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `bash scripts/setup.sh`",
        gguf.display()
    );
    // "The capital of France is", and the same with a longer lead.
    let prompts = vec![
        vec![504, 3575, 282, 4649, 314],
        vec![504, 3575, 282, 4649, 314, 504, 3575, 282, 4649, 314],
    ];
    degree_matches_one(&gguf, "smollm2", 3, &prompts);
}
