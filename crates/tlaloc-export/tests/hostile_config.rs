//! The `config_json` fuzz harness on a stable toolchain: every seed in `fuzz/seeds/config_json`
//! and seeded mutations of it (cargo-fuzz runs the same harness unbounded; see `fuzz/README.md`).

#[path = "../../../fuzz/harness/config_json.rs"]
mod harness;
#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;

#[test]
fn config_json_seeds_and_their_mutations_never_panic_or_allocate_per_claimed_layer() {
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/config_json");
    let runs = mutate::run_corpus(&corpus, 20_000, harness::run);
    eprintln!("config_json: {runs} inputs");
}
