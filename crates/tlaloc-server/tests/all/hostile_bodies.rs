//! The `request_body` fuzz harness on a stable toolchain: every seed in
//! `fuzz/seeds/request_body` and seeded mutations of it (cargo-fuzz runs the same harness
//! unbounded; see `fuzz/README.md`).

#[path = "../../../../fuzz/harness/mutate.rs"]
mod mutate;
#[path = "../../../../fuzz/harness/request_body.rs"]
mod request_body;

#[test]
fn request_body_seeds_and_their_mutations_never_panic() {
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/request_body");
    let runs = mutate::run_corpus(&corpus, 20_000, request_body::run);
    eprintln!("request_body: {runs} inputs");
}
