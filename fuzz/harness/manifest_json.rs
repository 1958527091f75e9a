//! Harness: arbitrary bytes as an artifact manifest (`tlaloc-serving.json`). What parses and
//! validates must describe entries the ladder derives and signatures the contract can build.
//! Shared by the cargo-fuzz target and the stable test that runs the seeds and their mutations.

pub fn run(data: &[u8]) {
    let Ok(manifest) = tlaloc_artifact::parse_manifest(data) else {
        return;
    };
    if manifest.validate().is_err() {
        return;
    }
    let points = manifest.ladder.points();
    assert_eq!(
        points.len(),
        manifest.entries.len(),
        "validated entries are the ladder's points"
    );
    for entry in &manifest.entries {
        assert!(points.contains(&entry.point()));
        let signature = tlaloc_artifact::ProgramSignature::expected_for(&manifest, entry);
        assert!(signature.check_against(&signature).is_ok());
    }
}
