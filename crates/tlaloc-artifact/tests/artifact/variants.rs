//! Body variants: listed per entry beside the portable body, hashed at open and by `verify`,
//! refused when malformed, and eligible for shipped executables.

use tlaloc_artifact::kernels::{CPU_MATMUL, CPU_PLATFORM, CPU_VARIANT};
use tlaloc_artifact::{
    Artifact, ArtifactError, BodyVariant, CompilerIdentity, IntegrityProblem, add_executables,
    paths,
};

use crate::fixture::{edit_manifest, written};

/// Writes `text` as a content-addressed body of the artifact in `dir`; returns its path.
fn write_body(dir: &std::path::Path, text: &str) -> String {
    let body = paths::body_path(&paths::sha256_hex(text.as_bytes()));
    std::fs::write(dir.join(&body), text).unwrap();
    body
}

fn cpu_variant(body: &str) -> serde_json::Value {
    serde_json::to_value(BodyVariant {
        name: CPU_VARIANT.into(),
        platform: CPU_PLATFORM.into(),
        kernels: vec![CPU_MATMUL.into()],
        body: body.into(),
    })
    .unwrap()
}

/// The fixture with a CPU variant on its first entry.
fn with_variant() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let (tmp, dir, _) = written();
    let body = write_body(&dir, "module @variant {}\n");
    let variant = cpu_variant(&body);
    edit_manifest(&dir, |m| m["entries"][0]["variants"] = vec![variant].into());
    (tmp, dir, body)
}

#[test]
fn an_exported_manifest_without_variants_does_not_mention_them() {
    let (_tmp, dir, _) = written();
    let text = std::fs::read_to_string(dir.join(tlaloc_artifact::MANIFEST_FILE)).unwrap();
    assert!(!text.contains("variants"), "{text}");
}

#[test]
fn a_variant_is_read_hashed_and_verified() {
    let (_tmp, dir, body) = with_variant();
    let artifact = Artifact::open(&dir).unwrap();
    let entry = &artifact.manifest().entries[0];
    let variant = entry.variant(CPU_VARIANT).expect("the variant");
    assert_eq!(variant.body, body);
    assert_eq!(
        entry.bodies().collect::<Vec<_>>(),
        [entry.body.as_str(), body.as_str()]
    );
    assert_eq!(
        artifact.body_text(&entry.with_body(&body)).unwrap(),
        "module @variant {}\n"
    );
    let report = artifact.verify().unwrap();
    assert!(report.files > 0);

    // A flipped byte in the variant body: refused at open (every body is hashed) and by verify.
    let mut bytes = std::fs::read(dir.join(&body)).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(dir.join(&body), &bytes).unwrap();
    match artifact.verify() {
        Err(ArtifactError::IntegrityFailed { problems }) => assert!(
            problems
                .iter()
                .any(|p| matches!(p, IntegrityProblem::HashMismatch { file, .. } if *file == body)),
            "{problems:?}"
        ),
        other => panic!("verify accepted a flipped variant body: {other:?}"),
    }
    assert!(matches!(
        Artifact::open(&dir),
        Err(ArtifactError::BodyHashMismatch { file, .. }) if file == body
    ));
}

#[test]
fn malformed_variants_are_refused_by_field() {
    /// Edits a variant, given the portable body's path.
    type Edit = fn(&mut serde_json::Value, &str);
    let cases: [(&str, Edit); 5] = [
        ("name", |v, _| v["name"] = "portable".into()),
        ("name", |v, _| v["name"] = "CPU".into()),
        ("platform", |v, _| v["platform"] = "".into()),
        ("body", |v, _| v["body"] = "bodies/nothex.mlir".into()),
        ("body", |v, portable| v["body"] = portable.into()),
    ];
    for (field, edit) in cases {
        let (_tmp, dir, _) = with_variant();
        edit_manifest(&dir, |m| {
            let portable = m["entries"][0]["body"].as_str().unwrap().to_owned();
            edit(&mut m["entries"][0]["variants"][0], &portable)
        });
        match Artifact::open(&dir) {
            Err(ArtifactError::InvalidManifest { field: f, .. }) => {
                assert!(f.ends_with(&format!(".{field}")), "{f}");
                assert!(f.contains("variants[0]"), "{f}");
            }
            other => panic!("accepted a variant with a bad {field}: {other:?}"),
        }
    }

    let (_tmp, dir, _) = with_variant();
    edit_manifest(&dir, |m| {
        let v = m["entries"][0]["variants"][0].clone();
        m["entries"][0]["variants"] = vec![v.clone(), v].into()
    });
    assert!(matches!(
        Artifact::open(&dir),
        Err(ArtifactError::InvalidManifest { reason, .. }) if reason.contains("twice")
    ));

    // A variant body outside the artifact.
    let (_tmp, dir, _) = with_variant();
    edit_manifest(&dir, |m| {
        m["entries"][0]["variants"][0]["body"] = format!("../{}", "a".repeat(64)).into()
    });
    assert!(Artifact::open(&dir).is_err());
}

fn identity() -> CompilerIdentity {
    CompilerIdentity {
        platform_name: "cpu".into(),
        device_kind: "cpu".into(),
        pjrt_api_version: "0.81".into(),
        platform_version: "cpu".into(),
        plugin_file_name: "a.so".into(),
        plugin_byte_length: 10,
        plugin_sha256: paths::sha256_hex(b"a.so"),
        xla_flags: String::new(),
        compile_options: "1a02".into(),
    }
}

#[test]
fn executables_may_be_shipped_for_the_portable_body_and_each_variant() {
    let (_tmp, dir, variant) = with_variant();
    let artifact = Artifact::open(&dir).unwrap();
    let mut executables: Vec<(String, String, Vec<u8>)> = artifact
        .manifest()
        .entries
        .iter()
        .map(|e| (e.name.clone(), e.body.clone(), e.body.clone().into_bytes()))
        .collect();
    let first = artifact.manifest().entries[0].name.clone();
    executables.push((first.clone(), variant.clone(), b"variant".to_vec()));
    let added = add_executables(&artifact, identity(), &executables).unwrap();
    let set = &added.artifact.manifest().executables[0];
    let of_first: Vec<&str> = set
        .entries
        .iter()
        .filter(|e| e.entry == first)
        .map(|e| e.body.as_str())
        .collect();
    assert_eq!(
        of_first,
        [
            artifact.manifest().entries[0].body.as_str(),
            variant.as_str()
        ]
    );

    // A body that is not one of the entry's is refused, when added and when read.
    let other_entry_body = artifact
        .manifest()
        .entries
        .iter()
        .map(|e| e.body.clone())
        .find(|b| *b != artifact.manifest().entries[0].body)
        .expect("the fixture has two bodies");
    let mut wrong = executables.clone();
    wrong.push((first, other_entry_body, b"x".to_vec()));
    assert!(matches!(
        add_executables(&added.artifact, identity(), &wrong),
        Err(ArtifactError::InvalidManifest { reason, .. }) if reason.contains("not one of its bodies")
    ));
}
