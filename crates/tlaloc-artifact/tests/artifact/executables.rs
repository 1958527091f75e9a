//! The manifest's `executables` section: absent from an exported artifact, added and replaced
//! by identity with deterministic bytes, refused when it points at the wrong body or entry.

use tlaloc_artifact::signature::SIGNATURE_FILE;
use tlaloc_artifact::{
    Artifact, ArtifactError, CompilerIdentity, IntegrityProblem, MANIFEST_FILE, add_executables,
};

use crate::fixture::{edit_manifest, written};

fn identity(plugin: &str) -> CompilerIdentity {
    CompilerIdentity {
        platform_name: "cpu".into(),
        device_kind: "cpu".into(),
        pjrt_api_version: "0.81".into(),
        platform_version: "cpu".into(),
        plugin_file_name: plugin.into(),
        plugin_byte_length: 10,
        plugin_sha256: tlaloc_artifact::paths::sha256_hex(plugin.as_bytes()),
        xla_flags: String::new(),
        compile_options: "1a02".into(),
    }
}

/// One made-up executable per entry; entries of one body get the same bytes, as compiling does.
fn executables(artifact: &Artifact, tag: &str) -> Vec<(String, String, Vec<u8>)> {
    artifact
        .manifest()
        .entries
        .iter()
        .map(|e| {
            let bytes = format!("{tag} {}", e.body).into_bytes();
            (e.name.clone(), e.body.clone(), bytes)
        })
        .collect()
}

fn manifest_bytes(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join(MANIFEST_FILE)).unwrap()
}

#[test]
fn an_exported_manifest_has_no_executables_section() {
    let (_tmp, dir, _) = written();
    let text = String::from_utf8(manifest_bytes(&dir)).unwrap();
    assert!(!text.contains("executables"), "{text}");
    assert!(!dir.join("executables").exists());
}

#[test]
fn sets_are_added_by_identity_replaced_in_place_and_written_deterministically() {
    let (tmp, dir, w) = written();
    let a = add_executables(
        &w.artifact,
        identity("a.so"),
        &executables(&w.artifact, "a"),
    )
    .unwrap();
    let bodies = w
        .manifest
        .entries
        .iter()
        .map(|e| e.body.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert_eq!(a.files, bodies);
    assert!(!a.replaced && !a.removed_signature);
    let b = add_executables(
        &a.artifact,
        identity("b.so"),
        &executables(&a.artifact, "b"),
    )
    .unwrap();
    assert_eq!(b.artifact.manifest().executables.len(), 2);
    let both = manifest_bytes(&dir);

    // Recompiling "a" with other bytes replaces its set and removes its old files.
    std::fs::write(dir.join(SIGNATURE_FILE), "stale").unwrap();
    let a2 = add_executables(
        &b.artifact,
        identity("a.so"),
        &executables(&b.artifact, "a2"),
    )
    .unwrap();
    assert!(a2.replaced && a2.removed_signature);
    assert!(!dir.join(SIGNATURE_FILE).exists());
    let files = std::fs::read_dir(dir.join("executables")).unwrap().count();
    assert_eq!(files, 2 * bodies);
    a2.artifact.verify().unwrap();

    // The same additions in another order give the same manifest bytes.
    let dir2 = tmp.path().join("again");
    let w2 = crate::fixture::write(&dir2);
    let b = add_executables(
        &w2.artifact,
        identity("b.so"),
        &executables(&w2.artifact, "b"),
    )
    .unwrap();
    let a = add_executables(
        &b.artifact,
        identity("a.so"),
        &executables(&b.artifact, "a"),
    )
    .unwrap();
    drop(a);
    assert_eq!(manifest_bytes(&dir2), both);
}

#[test]
fn an_executable_for_another_body_or_entry_is_refused() {
    let (_tmp, dir, w) = written();
    let a = add_executables(
        &w.artifact,
        identity("a.so"),
        &executables(&w.artifact, "a"),
    )
    .unwrap();
    let first = &w.manifest.entries[0].body;
    let other_body = w
        .manifest
        .entries
        .iter()
        .map(|e| e.body.clone())
        .find(|b| b != first)
        .expect("the fixture has two bodies");
    edit_manifest(&dir, |m| {
        m["executables"][0]["entries"][0]["body"] = other_body.clone().into()
    });
    match Artifact::open(&dir) {
        Err(ArtifactError::InvalidManifest { field, .. }) => {
            assert!(field.starts_with("executables[0].entries[0]"), "{field}")
        }
        other => panic!("accepted an executable of another body: {other:?}"),
    }
    drop(a);

    let (_tmp, dir, w) = written();
    add_executables(
        &w.artifact,
        identity("a.so"),
        &executables(&w.artifact, "a"),
    )
    .unwrap();
    edit_manifest(&dir, |m| {
        m["executables"][0]["entries"][0]["entry"] = "no_such_entry".into()
    });
    assert!(matches!(
        Artifact::open(&dir),
        Err(ArtifactError::InvalidManifest { .. })
    ));
}

#[test]
fn a_flipped_executable_byte_is_refused_at_read_and_by_verify() {
    let (_tmp, dir, w) = written();
    let added = add_executables(
        &w.artifact,
        identity("a.so"),
        &executables(&w.artifact, "a"),
    )
    .unwrap();
    let entry = added.artifact.manifest().executables[0].entries[0].clone();
    assert_eq!(
        added.artifact.executable_bytes(&entry).unwrap(),
        format!("a {}", entry.body).into_bytes()
    );
    let path = dir.join(&entry.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        added.artifact.executable_bytes(&entry),
        Err(ArtifactError::ExecutableHashMismatch { file, .. }) if file == entry.file
    ));
    match added.artifact.verify() {
        Err(ArtifactError::IntegrityFailed { problems }) => assert!(
            problems.iter().all(
                |p| matches!(p, IntegrityProblem::HashMismatch { file, .. } if *file == entry.file)
            ),
            "{problems:?}"
        ),
        other => panic!("verify accepted a flipped executable: {other:?}"),
    }
}
