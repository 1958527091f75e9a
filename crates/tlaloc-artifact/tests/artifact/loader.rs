//! Loader: a round trip of the fixture, and every refusal produced by corrupting a written
//! artifact.

use std::path::Path;

use sha2::{Digest, Sha256};
use tlaloc_artifact::{
    Artifact, ArtifactError, IntegrityProblem, LadderError, MANIFEST_FILE, OperandRole,
    ProgramSignature,
};

use crate::fixture::{self, DECODE_BODY, PREFILL_BODY, TOKENIZER_JSON};

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn open_err(dir: &Path) -> ArtifactError {
    match Artifact::open(dir) {
        Ok(_) => panic!("the corrupted artifact was accepted"),
        Err(e) => e,
    }
}

#[test]
fn round_trip_gives_back_what_was_written() {
    let (_tmp, dir, written) = fixture::written();
    let artifact = Artifact::open(&dir).expect("open");
    assert_eq!(artifact.manifest(), &written.manifest);

    for entry in &artifact.manifest().entries {
        let expected = match entry.kind {
            tlaloc_artifact::EntryKind::Decode => DECODE_BODY,
            tlaloc_artifact::EntryKind::Prefill => PREFILL_BODY,
        };
        assert_eq!(artifact.body_text(entry).expect("body"), expected);
        assert_eq!(
            artifact.program(&entry.name).expect("program"),
            &ProgramSignature::expected_for(artifact.manifest(), entry)
        );
    }
    for (slot, bytes) in &written.weights {
        assert_eq!(&artifact.weight_bytes(slot).expect("weight"), bytes);
        let row = artifact.manifest().weight(slot).expect("row");
        assert_eq!(row.sha256, sha256_hex(bytes));
        assert_eq!(row.byte_length, bytes.len() as u64);
    }

    let report = artifact.verify().expect("verify");
    let weight_bytes: usize = written.weights.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(report.files, 2 + written.weights.len() + 1);
    assert_eq!(
        report.bytes as usize,
        DECODE_BODY.len() + PREFILL_BODY.len() + weight_bytes + TOKENIZER_JSON.len()
    );
    assert!(matches!(
        artifact.weight_bytes("layers.9.qkv_proj"),
        Err(ArtifactError::UnknownWeightSlot { .. })
    ));
}

#[test]
fn entries_are_found_through_the_ladder() {
    let (_tmp, _dir, written) = fixture::written();
    let manifest = written.artifact.manifest();
    let point = manifest.ladder.decode_entry(2, 17).expect("point");
    let entry = manifest.entry_for(&point).expect("entry");
    assert_eq!((entry.batch, entry.tokens, entry.context), (2, 1, 32));
    let program = written.artifact.program(&entry.name).expect("program");
    let tables = &program.inputs[2];
    assert_eq!(tables.role, OperandRole::BlockTables);
    assert_eq!(tables.dims, vec![2, 32 / 8]);
}

#[test]
fn unknown_format_version_is_refused_naming_both_versions() {
    let (_tmp, dir, _) = fixture::written();
    fixture::edit_manifest(&dir, |m| m["formatVersion"] = 99.into());
    let err = open_err(&dir);
    assert!(
        matches!(
            err,
            ArtifactError::UnsupportedFormatVersion {
                found: 99,
                supported: 4
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("formatVersion 4"), "{err}");
}

#[test]
fn relative_path_leaving_the_directory_is_refused() {
    let (_tmp, dir, _) = fixture::written();
    fixture::edit_manifest(&dir, |m| m["weights"][1]["file"] = "../x".into());
    let err = open_err(&dir);
    match &err {
        ArtifactError::PathEscapes { path, field, .. } => {
            assert_eq!(path, "../x");
            assert_eq!(field, "weights[1].file");
        }
        other => panic!("expected PathEscapes, got {other:?}"),
    }
    assert!(err.to_string().contains("\"../x\""), "{err}");
}

#[test]
fn absolute_path_is_refused_even_inside_the_directory() {
    let (_tmp, dir, written) = fixture::written();
    let inside = dir
        .canonicalize()
        .expect("canonical")
        .join(&written.manifest.tokenizer.files[0].path);
    assert!(inside.is_file());
    let absolute = inside.to_str().expect("utf-8 path").to_owned();
    fixture::edit_manifest(&dir, |m| {
        m["tokenizer"]["files"][0]["path"] = absolute.clone().into()
    });
    match open_err(&dir) {
        ArtifactError::PathEscapes {
            path,
            field,
            reason,
        } => {
            assert_eq!(path, absolute);
            assert_eq!(field, "tokenizer.files[0].path");
            assert!(reason.contains("absolute"), "{reason}");
        }
        other => panic!("expected PathEscapes, got {other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn symlink_escaping_the_directory_is_refused() {
    let (tmp, dir, written) = fixture::written();
    let weight = &written.manifest.weights[0];
    let outside = tmp.path().join("outside.bin");
    std::fs::write(&outside, &written.weights[0].1).expect("write outside");
    let inside = dir.join(&weight.file);
    std::fs::remove_file(&inside).expect("remove");
    std::os::unix::fs::symlink(&outside, &inside).expect("symlink");
    match open_err(&dir) {
        ArtifactError::PathEscapes { path, reason, .. } => {
            assert_eq!(path, weight.file);
            assert!(reason.contains("outside"), "{reason}");
        }
        other => panic!("expected PathEscapes, got {other:?}"),
    }
}

#[test]
fn missing_file_is_refused_naming_it() {
    let (_tmp, dir, written) = fixture::written();
    let file = &written.manifest.weights[2].file;
    std::fs::remove_file(dir.join(file)).expect("remove");
    match open_err(&dir) {
        ArtifactError::MissingFile { path, field } => {
            assert_eq!(&path, file);
            assert_eq!(field, "weights[2].file");
        }
        other => panic!("expected MissingFile, got {other:?}"),
    }
}

#[test]
fn missing_manifest_is_refused() {
    let (_tmp, dir, _) = fixture::written();
    std::fs::remove_file(dir.join(MANIFEST_FILE)).expect("remove");
    match open_err(&dir) {
        ArtifactError::MissingFile { path, .. } => assert_eq!(path, MANIFEST_FILE),
        other => panic!("expected MissingFile, got {other:?}"),
    }
}

fn flip_first_byte(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[0] ^= 0x01;
    std::fs::write(path, bytes).expect("write");
}

/// Regression: a body edited in place (its name still the old hash) was found only when its
/// entry was first compiled, and never when a compile cache already held that name.
#[test]
fn a_tampered_body_is_refused_when_the_artifact_is_opened() {
    let (_tmp, dir, written) = fixture::written();
    let entry = written.manifest.entries[0].clone();
    flip_first_byte(&dir.join(&entry.body));
    match Artifact::open(&dir).unwrap_err() {
        ArtifactError::BodyHashMismatch { file, .. } => assert_eq!(file, entry.body),
        other => panic!("expected BodyHashMismatch, got {other:?}"),
    }
}

#[test]
fn a_body_tampered_after_open_is_refused_by_body_text_and_verify() {
    let (_tmp, dir, written) = fixture::written();
    let entry = written.manifest.entries[0].clone();
    let artifact = Artifact::open(&dir).expect("an untouched artifact opens");
    flip_first_byte(&dir.join(&entry.body));
    let err = artifact.body_text(&entry).unwrap_err();
    match &err {
        ArtifactError::BodyHashMismatch { file, found } => {
            assert_eq!(file, &entry.body);
            assert_ne!(found, &sha256_hex(DECODE_BODY.as_bytes()));
        }
        other => panic!("expected BodyHashMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&entry.body), "{err}");
    match artifact.verify().unwrap_err() {
        ArtifactError::IntegrityFailed { problems } => {
            let files: Vec<&str> = problems.iter().map(IntegrityProblem::file).collect();
            assert_eq!(files, vec![entry.body.as_str()]);
        }
        other => panic!("expected IntegrityFailed, got {other:?}"),
    }
}

#[test]
fn verify_reports_every_tampered_file() {
    let (_tmp, dir, written) = fixture::written();
    let body = &written.manifest.entries.last().expect("entries").body;
    let weight = &written.manifest.weights[1].file;
    let tokenizer = &written.manifest.tokenizer.files[0].path;
    // Tampered after opening (opening itself refuses a tampered body).
    let artifact = Artifact::open(&dir).expect("an untouched artifact opens");
    for file in [body, weight, tokenizer] {
        flip_first_byte(&dir.join(file));
    }
    let err = artifact.verify().unwrap_err();
    match &err {
        ArtifactError::IntegrityFailed { problems } => {
            let mut files: Vec<&str> = problems.iter().map(IntegrityProblem::file).collect();
            files.sort_unstable();
            let mut expected = vec![body.as_str(), weight.as_str(), tokenizer.as_str()];
            expected.sort_unstable();
            assert_eq!(files, expected);
            for problem in problems {
                let IntegrityProblem::HashMismatch {
                    file,
                    expected,
                    found,
                } = problem
                else {
                    panic!("expected a hash mismatch, got {problem:?}");
                };
                assert_eq!(found, &sha256_hex(&std::fs::read(dir.join(file)).unwrap()));
                assert_ne!(found, expected);
            }
        }
        other => panic!("expected IntegrityFailed, got {other:?}"),
    }
    let message = err.to_string();
    for file in [body, weight, tokenizer] {
        assert!(message.contains(file.as_str()), "{message}");
    }
}

#[test]
fn weight_file_of_the_wrong_length_is_refused_naming_it() {
    let (_tmp, dir, written) = fixture::written();
    let weight = &written.manifest.weights[1];
    let mut bytes = written.weights[1].1.clone();
    bytes.push(0);
    std::fs::write(dir.join(&weight.file), &bytes).expect("write");
    let err = open_err(&dir);
    match &err {
        ArtifactError::WeightLengthMismatch {
            file,
            slot,
            expected,
            found,
        } => {
            assert_eq!(file, &weight.file);
            assert_eq!(slot, &weight.slot);
            assert_eq!(*expected, weight.byte_length);
            assert_eq!(*found, weight.byte_length + 1);
        }
        other => panic!("expected WeightLengthMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&weight.file), "{err}");
}

#[test]
fn program_whose_dims_disagree_is_refused_naming_entry_and_field() {
    let (_tmp, dir, written) = fixture::written();
    let entry = &written.manifest.entries[1];
    fixture::edit_json(&dir.join(&entry.program), |p| {
        p["inputs"][2]["dims"] = serde_json::json!([entry.batch, 99]);
    });
    let err = open_err(&dir);
    match &err {
        ArtifactError::ProgramSignatureMismatch {
            entry: name,
            file,
            mismatch,
        } => {
            assert_eq!(name, &entry.name);
            assert_eq!(file, &entry.program);
            assert_eq!(mismatch.field, "inputs[2] (blockTables).dims");
            assert_eq!(mismatch.found, format!("[{}, 99]", entry.batch));
        }
        other => panic!("expected ProgramSignatureMismatch, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&entry.name) && message.contains("blockTables"),
        "{message}"
    );
}

#[test]
fn program_missing_a_donation_is_refused() {
    let (_tmp, dir, written) = fixture::written();
    let entry = &written.manifest.entries[0];
    fixture::edit_json(&dir.join(&entry.program), |p| {
        p["donations"].as_array_mut().expect("donations").pop();
    });
    match open_err(&dir) {
        ArtifactError::ProgramSignatureMismatch { mismatch, .. } => {
            assert_eq!(mismatch.field, "donations")
        }
        other => panic!("expected ProgramSignatureMismatch, got {other:?}"),
    }
}

#[test]
fn manifest_with_a_block_size_not_dividing_a_context_is_refused() {
    let (_tmp, dir, _) = fixture::written();
    fixture::edit_manifest(&dir, |m| {
        m["ladder"]["contextBuckets"] = serde_json::json!([12, 32])
    });
    match open_err(&dir) {
        ArtifactError::InvalidLadder { source } => assert_eq!(
            source,
            LadderError::BlockSizeDoesNotDivideContext {
                block_size: 8,
                context: 12
            }
        ),
        other => panic!("expected InvalidLadder, got {other:?}"),
    }
}

#[test]
fn manifest_inconsistencies_are_refused_naming_the_field() {
    type Corrupt = fn(&mut serde_json::Value);
    let cases: [(&str, Corrupt); 9] = [
        ("padding", |m| m["padding"]["seqLens"] = 0.into()),
        // Quantized pools without scales, and float pools with them.
        ("kvCache.scales", |m| m["kvCache"]["dtype"] = "i8".into()),
        (
            "kvCache.scales",
            |m| {
                m["kvCache"]["scales"] =
                    serde_json::json!({"dtype": "f32", "granularity": "perTokenHead"})
            },
        ),
        ("kvCache.scales.dtype", |m| {
            m["kvCache"]["dtype"] = "f8e4m3fn".into();
            m["kvCache"]["scales"] =
                serde_json::json!({"dtype": "bf16", "granularity": "perTokenHead"})
        }),
        ("kvCache.dtype", |m| m["kvCache"]["dtype"] = "u8".into()),
        ("kvCache.numLayers", |m| {
            m["kvCache"]["numLayers"] = 3.into()
        }),
        ("kvCache.numBlocks", |m| {
            m["kvCache"]["numBlocks"] = 4.into()
        }),
        ("entries", |m| {
            m["entries"].as_array_mut().expect("entries").pop();
        }),
        ("weights[0] (embed_tokens).byteLength", |m| {
            m["weights"][0]["dims"] = serde_json::json!([10, 5])
        }),
    ];
    for (field, corrupt) in cases {
        let (_tmp, dir, _) = fixture::written();
        fixture::edit_manifest(&dir, corrupt);
        match open_err(&dir) {
            ArtifactError::InvalidManifest { field: f, .. } => assert_eq!(f, field),
            other => panic!("expected InvalidManifest at {field}, got {other:?}"),
        }
    }
}

#[test]
fn unknown_manifest_field_is_refused_naming_it() {
    let (_tmp, dir, _) = fixture::written();
    fixture::edit_manifest(&dir, |m| m["kvCache"]["quantization"] = "int4".into());
    let err = open_err(&dir);
    assert!(matches!(err, ArtifactError::Json { .. }), "{err:?}");
    assert!(err.to_string().contains("quantization"), "{err}");
}

/// A block-quantized weight entry: logical dims, `u8`, `blockFormat`; its byte length and its
/// signature operand are the blocks'. An entry without the field reads as dense, and a block
/// entry whose dims are not whole blocks, whose dtype is not u8 or whose length disagrees is
/// refused, naming the field.
#[test]
fn a_block_quantized_weight_entry_is_validated_by_its_format() {
    let (_tmp, dir, written) = fixture::written();
    let bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    let manifest = tlaloc_artifact::parse_manifest(&bytes).unwrap();
    assert!(manifest.weights.iter().all(|w| w.block_format.is_none()));
    let mut json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(json["weights"][1].get("blockFormat").is_none());
    // layers.0.qkv_proj as a Q8_0 [2, 64]: 2 rows of 2 blocks of 34 bytes.
    let w = &mut json["weights"][1];
    w["dtype"] = "u8".into();
    w["dims"] = serde_json::json!([2, 64]);
    w["byteLength"] = 136.into();
    w["blockFormat"] = "q8_0".into();
    let parse = |json: &serde_json::Value| {
        let manifest = tlaloc_artifact::parse_manifest(&serde_json::to_vec(json).unwrap())?;
        manifest.validate().map(|()| manifest)
    };
    let manifest = parse(&json).unwrap();
    let entry = manifest.weight("layers.0.qkv_proj").unwrap();
    assert_eq!(entry.block_format, Some(tlaloc_artifact::BlockFormat::Q8_0));
    assert_eq!(
        entry.operand().unwrap(),
        (tlaloc_artifact::Dtype::U8, vec![2, 68])
    );
    let signature = ProgramSignature::expected_for(&manifest, &written.manifest.entries[0]);
    let spec = signature
        .inputs
        .iter()
        .find(|s| s.name == "layers.0.qkv_proj")
        .unwrap();
    assert_eq!(
        (spec.dtype, spec.dims.clone()),
        (tlaloc_artifact::Dtype::U8, vec![2, 68])
    );
    for (field, value, needle) in [
        (
            "dims",
            serde_json::json!([2, 48]),
            "weights[1] (layers.0.qkv_proj).dims",
        ),
        (
            "dtype",
            "f32".into(),
            "weights[1] (layers.0.qkv_proj).dtype",
        ),
        (
            "byteLength",
            128.into(),
            "weights[1] (layers.0.qkv_proj).byteLength",
        ),
    ] {
        let mut bad = json.clone();
        bad["weights"][1][field] = value;
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.contains(needle), "{field}: {err}");
    }
    let mut bad = json.clone();
    bad["weights"][1]["blockFormat"] = "q3_x".into();
    assert!(parse(&bad).is_err());
}
