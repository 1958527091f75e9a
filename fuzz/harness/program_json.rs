//! Harness: arbitrary bytes as a program signature (`programs/<entry>.json`). What parses must
//! agree with itself and survive a write and a re-read unchanged.
//! Shared by the cargo-fuzz target and the stable test that runs the seeds and their mutations.

pub fn run(data: &[u8]) {
    let Ok(signature) = serde_json::from_slice::<tlaloc_artifact::ProgramSignature>(data) else {
        return;
    };
    assert!(signature.check_against(&signature).is_ok());
    let bytes = signature
        .to_json_bytes()
        .expect("a parsed signature serializes");
    let again: tlaloc_artifact::ProgramSignature =
        serde_json::from_slice(&bytes).expect("what was written parses");
    assert_eq!(again, signature);
}
