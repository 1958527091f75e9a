//! The `manifest_json` and `program_json` fuzz harnesses on a stable toolchain: every seed in
//! `fuzz/seeds/<target>` and seeded mutations of it (cargo-fuzz runs the same harnesses
//! unbounded; see `fuzz/README.md`).

#[path = "../../../../fuzz/harness/manifest_json.rs"]
mod manifest_harness;
#[path = "../../../../fuzz/harness/mutate.rs"]
mod mutate;
#[path = "../../../../fuzz/harness/program_json.rs"]
mod program_harness;

fn seeds(target: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

#[test]
fn manifest_json_seeds_and_their_mutations_never_panic() {
    let runs = mutate::run_corpus(&seeds("manifest_json"), 10_000, manifest_harness::run);
    eprintln!("manifest_json: {runs} inputs");
}

#[test]
fn program_json_seeds_and_their_mutations_never_panic() {
    let runs = mutate::run_corpus(&seeds("program_json"), 10_000, program_harness::run);
    eprintln!("program_json: {runs} inputs");
}
