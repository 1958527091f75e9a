//! Executables compiled into the artifact (`compile_into_artifact`) and loaded from it, on every
//! test plugin: same bits as compiling, never used by another plugin, never loaded when altered.

use std::path::Path;

use tlaloc_artifact::{Artifact, ArtifactError, IntegrityProblem};
use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::scheduler::Scheduler;
use tlaloc_runtime::{
    CompileMode, GenerateRequest, LoadError, LoadOptions, Model, ModelExecutor,
    compile_into_artifact,
};

use crate::model_runs::options;
use crate::toy;

/// Options for `plugin` with no compile cache, so every entry either comes from the artifact
/// or is compiled now.
fn uncached(plugin: &Path) -> LoadOptions {
    options(plugin, None, CompileMode::Eager)
}

fn name(plugin: &Path) -> String {
    plugin.file_name().unwrap().to_string_lossy().into_owned()
}

/// The artifact's executable files, in name order.
fn executable_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("executables"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn a_shipped_executable_gives_the_bits_of_a_compiled_one_on_every_plugin() {
    for plugin in test_plugin_paths() {
        let (_tmp, dir) = toy::temp(32);
        let report = compile_into_artifact(&dir, &uncached(&plugin)).unwrap();
        let entries = Artifact::open(&dir).unwrap().manifest().entries.len();
        assert_eq!(report.entries, entries);
        assert!(report.files > 0 && report.files <= entries, "{report:?}");

        let mut compiled = Model::load(
            &dir,
            &LoadOptions {
                artifact_executables: false,
                ..uncached(&plugin)
            },
        )
        .unwrap();
        let mut shipped = Model::load(&dir, &uncached(&plugin)).unwrap();
        let (c, s) = (
            compiled.load_timings().unwrap(),
            shipped.load_timings().unwrap(),
        );
        assert_eq!((c.from_artifact, s.compiled, s.cache_hits), (0, 0, 0));
        assert!(
            s.from_artifact > 0 && s.from_artifact == c.compiled,
            "{s:?}"
        );
        let line = s.executables.unwrap();
        assert!(line.contains("identity matches"), "{line}");

        // The same steps on both: every output and every pool byte for byte.
        let mut scheduler = Scheduler::new(compiled.shape()).unwrap();
        scheduler
            .add(1, GenerateRequest::greedy(vec![3, 1, 4, 1, 5, 9, 2, 6], 12))
            .unwrap();
        scheduler
            .add(2, GenerateRequest::greedy(vec![2, 7, 1], 9))
            .unwrap();
        let mut steps = 0;
        while let Some(mut step) = scheduler.schedule().unwrap() {
            step.inputs.want_logits = true;
            let a = compiled.step(&step.entry, &step.inputs).unwrap();
            let b = shipped.step(&step.entry, &step.inputs).unwrap();
            assert_eq!(
                a.next_tokens,
                b.next_tokens,
                "{}: step {steps}",
                name(&plugin)
            );
            let bits = |l: &Option<Vec<f32>>| {
                l.as_ref()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<u32>>()
            };
            assert_eq!(
                bits(&a.logits),
                bits(&b.logits),
                "{}: step {steps}",
                name(&plugin)
            );
            scheduler.complete(&step, &a).unwrap();
            steps += 1;
        }
        assert!(steps > 2, "{steps} steps");
        for pool in 0..2 {
            assert_eq!(compiled.read_pool(pool), shipped.read_pool(pool));
        }
    }
}

#[test]
fn executables_of_another_plugin_build_are_not_used_and_the_log_says_why() {
    let plugins = test_plugin_paths();
    for (i, builder) in plugins.iter().enumerate() {
        let (_tmp, dir) = toy::temp(32);
        compile_into_artifact(&dir, &uncached(builder)).unwrap();
        // Every other test plugin compiles instead, naming the plugin that built them.
        for loader in plugins.iter().filter(|p| *p != builder) {
            let model = Model::load(&dir, &uncached(loader)).unwrap();
            let t = model.load_timings().unwrap();
            assert_eq!(
                t.from_artifact,
                0,
                "{} loaded {}'s",
                name(loader),
                name(builder)
            );
            assert!(t.compiled > 0);
            let line = t.executables.unwrap();
            assert!(
                line.contains("built by") && line.contains(&name(builder)),
                "{line}"
            );
            assert!(line.contains("pluginSha256"), "{line}");
        }
        // The same plugin with another recorded build hash (as a rebuilt plugin would have).
        let manifest_path = dir.join(tlaloc_artifact::MANIFEST_FILE);
        let text = std::fs::read_to_string(&manifest_path).unwrap();
        let mut manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        manifest["executables"][0]["identity"]["pluginSha256"] =
            serde_json::Value::String(format!("{i:0>64}"));
        std::fs::write(
            &manifest_path,
            serde_json::to_vec_pretty(&manifest).unwrap(),
        )
        .unwrap();
        let model = Model::load(&dir, &uncached(builder)).unwrap();
        let t = model.load_timings().unwrap();
        assert_eq!(t.from_artifact, 0);
        let line = t.executables.unwrap();
        assert!(line.contains("differs in pluginSha256"), "{line}");
    }
}

#[test]
fn a_flipped_byte_in_a_shipped_executable_is_refused_by_verify_and_by_the_loader() {
    for plugin in test_plugin_paths() {
        let (_tmp, dir) = toy::temp(32);
        compile_into_artifact(&dir, &uncached(&plugin)).unwrap();
        let victim = executable_files(&dir).remove(0);
        let relative = format!(
            "executables/{}",
            victim.file_name().unwrap().to_string_lossy()
        );
        let mut bytes = std::fs::read(&victim).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(&victim, &bytes).unwrap();

        match Artifact::open(&dir).unwrap().verify() {
            Err(ArtifactError::IntegrityFailed { problems }) => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(
                    matches!(&problems[0], IntegrityProblem::HashMismatch { file, .. } if *file == relative)
                );
            }
            other => panic!("verify accepted a flipped executable: {other:?}"),
        }
        // Without verifying first, the loader hashes the file before the plugin sees it.
        let unverified = LoadOptions {
            verify: false,
            ..uncached(&plugin)
        };
        match Model::load(&dir, &unverified) {
            Err(LoadError::Artifact(ArtifactError::ExecutableHashMismatch { file, .. })) => {
                assert_eq!(file, relative)
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("{}: loaded a flipped executable", name(&plugin)),
        }
        // Asked not to use the artifact's executables, the same artifact loads by compiling.
        let model = Model::load(
            &dir,
            &LoadOptions {
                artifact_executables: false,
                ..unverified
            },
        )
        .unwrap();
        assert_eq!(model.load_timings().unwrap().from_artifact, 0);
    }
}

#[test]
fn lazily_loaded_entries_come_from_the_artifact_too() {
    for plugin in test_plugin_paths() {
        let (_tmp, dir) = toy::temp(32);
        compile_into_artifact(&dir, &uncached(&plugin)).unwrap();
        // Entries made ready on first use take the shipped executables the same way.
        let model = Model::load(&dir, &options(&plugin, None, CompileMode::Lazy)).unwrap();
        let line = model.load_timings().unwrap().executables.unwrap();
        assert!(
            line.contains("load from the artifact on first use"),
            "{line}"
        );
        let engine = tlaloc_runtime::Engine::start(model).unwrap();
        let prompt = vec![5, 3, 8];
        let got = engine
            .generate_blocking(GenerateRequest::greedy(prompt.clone(), 7))
            .unwrap();
        assert_eq!(got.token_ids, toy::reference_generate(&prompt, 7));
        engine.shutdown();
    }
}
