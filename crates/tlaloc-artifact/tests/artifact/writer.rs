//! Writer: content addressing, determinism, JSON shape, and refusals.

use std::collections::BTreeMap;
use std::path::Path;

use tlaloc_artifact::{
    ArtifactError, ArtifactWriter, Dtype, ExistingDir, MANIFEST_FILE, ProgramSignature,
};

use crate::fixture;

/// Every file under `dir`, by relative path.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("prefix").to_string_lossy();
                out.insert(rel.into_owned(), std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn two_identical_writes_are_byte_identical() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fixture::write(&tmp.path().join("a"));
    fixture::write(&tmp.path().join("b"));
    let a = tree(&tmp.path().join("a"));
    let b = tree(&tmp.path().join("b"));
    assert!(a.contains_key(MANIFEST_FILE));
    assert_eq!(a, b);
    assert!(a[MANIFEST_FILE].ends_with(b"}\n"));
}

#[test]
fn bodies_are_named_by_their_sha256_and_stored_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut writer = ArtifactWriter::create(tmp.path().join("a")).expect("create");
    // FIPS 180-2 test vector: sha256("abc").
    let path = writer.write_body("abc").expect("body");
    assert_eq!(
        path,
        "bodies/ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.mlir"
    );
    assert_eq!(writer.write_body("abc").expect("again"), path);

    let (_tmp, dir, written) = fixture::written();
    let bodies = std::fs::read_dir(dir.join("bodies"))
        .expect("bodies")
        .count();
    assert_eq!(bodies, 2);
    assert!(written.manifest.entries.len() > bodies);
}

#[test]
fn manifest_json_uses_the_documented_camel_case_shape() {
    let (_tmp, dir, written) = fixture::written();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).expect("read")).unwrap();
    assert_eq!(m["formatVersion"], tlaloc_artifact::FORMAT_VERSION);
    assert_eq!(m["model"]["numKvHeads"], 1);
    assert_eq!(m["model"]["ropeScaling"]["type"], "llama3");
    assert_eq!(
        m["model"]["ropeScaling"]["originalMaxPositionEmbeddings"],
        8192
    );
    assert_eq!(m["model"]["bosTokenId"], 1);
    assert_eq!(m["kvCache"]["scratchBlock"], 0);
    assert_eq!(m["padding"]["seqLens"], 1);
    assert_eq!(m["padding"]["slotMapping"], -1);
    assert_eq!(m["tokenizer"]["chatTemplate"], serde_json::Value::Null);
    assert_eq!(m["entries"][0]["kind"], "decode");
    assert_eq!(
        m["weights"][1]["file"],
        "weights/0001_layers.0.qkv_proj.bin"
    );
    assert_eq!(m["weights"][1]["byteLength"], 64);

    let entry = &written.manifest.entries[0];
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(&entry.program)).expect("read")).unwrap();
    assert_eq!(p["inputs"][0]["role"]["kind"], "tokenIds");
    assert_eq!(p["inputs"][5]["role"]["kind"], "weight");
    assert_eq!(p["inputs"][5]["role"]["slot"], "embed_tokens");
    assert_eq!(p["outputs"][2]["role"]["kind"], "nextTokenIds");
    assert_eq!(p["outputs"][2]["dims"], serde_json::json!([entry.batch, 1]));
    assert_eq!(p["outputs"][3]["role"]["kind"], "nextPositions");
    assert_eq!(p["outputs"][3]["dims"], serde_json::json!([entry.batch, 1]));
    assert_eq!(p["outputs"][4]["role"]["kind"], "nextSeqLens");
    assert_eq!(p["outputs"][5]["role"]["kind"], "nextSlotMapping");
    assert_eq!(p["outputs"][5]["dims"], serde_json::json!([entry.batch]));
    assert_eq!(p["outputs"][6]["role"]["kind"], "kPool");
    assert_eq!(p["outputs"][6]["role"]["layer"], 0);
}

#[test]
fn expected_signature_follows_the_contract_order() {
    let (_tmp, _dir, written) = fixture::written();
    let manifest = &written.manifest;
    let entry = manifest
        .entries
        .iter()
        .find(|e| e.kind == tlaloc_artifact::EntryKind::Prefill && e.context == 32)
        .expect("prefill entry");
    let sig = ProgramSignature::expected_for(manifest, entry);
    let names: Vec<&str> = sig.inputs.iter().map(|s| s.name.as_str()).collect();
    let mut expected = vec![
        "tokenIds",
        "positions",
        "blockTables",
        "seqLens",
        "slotMapping",
    ];
    expected.extend(manifest.weights.iter().map(|w| w.slot.as_str()));
    expected.extend(["kPool.0", "vPool.0", "kPool.1", "vPool.1"]);
    assert_eq!(names, expected);
    let (b, t) = (entry.batch, entry.tokens);
    assert_eq!(sig.inputs[0].dims, vec![b, t]);
    assert_eq!(sig.inputs[4].dims, vec![b * t]);
    assert_eq!(sig.outputs[0].dims, vec![b, manifest.model.vocab_size]);
    assert_eq!(sig.outputs[0].dtype, Dtype::F32);
    assert_eq!(sig.outputs[1].dtype, Dtype::I32);
    assert_eq!(sig.outputs[2].name, "nextTokenIds");
    assert_eq!(
        (sig.outputs[2].dtype, &sig.outputs[2].dims),
        (Dtype::I32, &vec![b, 1])
    );
    // The next decode step's inputs, decode-shaped whatever this entry's tokens per row.
    let next: Vec<(&str, &Vec<usize>)> = sig.outputs[3..6]
        .iter()
        .map(|s| (s.name.as_str(), &s.dims))
        .collect();
    assert_eq!(
        next,
        [
            ("nextPositions", &vec![b, 1]),
            ("nextSeqLens", &vec![b]),
            ("nextSlotMapping", &vec![b])
        ]
    );
    assert_eq!(sig.donations.len(), 2 * manifest.model.num_layers);
    for d in &sig.donations {
        assert_eq!(sig.inputs[d.input], sig.outputs[d.output]);
        assert_eq!(sig.inputs[d.input].dims, vec![9, 8, 1, 2]);
    }
}

#[test]
fn decode_entries_donate_each_carried_step_input_to_the_output_that_carries_it() {
    let (_tmp, _dir, written) = fixture::written();
    let manifest = &written.manifest;
    let decode = manifest
        .entries
        .iter()
        .find(|e| e.kind == tlaloc_artifact::EntryKind::Decode)
        .expect("decode entry");
    let sig = ProgramSignature::expected_for(manifest, decode);
    let step: Vec<(&str, &str)> = sig
        .donations
        .iter()
        .filter(|d| d.input < 5)
        .map(|d| {
            let (input, output) = (&sig.inputs[d.input], &sig.outputs[d.output]);
            // Aliased buffers must agree in everything but the name.
            assert_eq!((input.dtype, &input.dims), (output.dtype, &output.dims));
            (input.name.as_str(), output.name.as_str())
        })
        .collect();
    assert_eq!(
        step,
        [
            ("tokenIds", "nextTokenIds"),
            ("positions", "nextPositions"),
            ("seqLens", "nextSeqLens"),
            ("slotMapping", "nextSlotMapping"),
        ]
    );
    // The pools follow, as in every entry.
    assert_eq!(
        sig.donations.len(),
        step.len() + 2 * manifest.model.num_layers
    );
}

#[test]
fn non_empty_directory_is_refused_unless_it_is_an_artifact_to_replace() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep me").unwrap();
    for mode in [ExistingDir::Refuse, ExistingDir::ReplaceArtifact] {
        let err = ArtifactWriter::create_with(&other, mode).unwrap_err();
        assert!(
            matches!(
                err,
                ArtifactError::DirectoryNotEmpty { .. } | ArtifactError::NotAnArtifact { .. }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("other"), "{err}");
    }
    assert!(other.join("notes.txt").is_file());

    let (_tmp, dir, _) = fixture::written();
    assert!(matches!(
        ArtifactWriter::create(&dir),
        Err(ArtifactError::DirectoryNotEmpty { .. })
    ));
    let writer = ArtifactWriter::create_with(&dir, ExistingDir::ReplaceArtifact).expect("replace");
    assert!(!writer.root().join(MANIFEST_FILE).exists());
}

#[test]
fn writer_refuses_bad_weights_and_programs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut writer = ArtifactWriter::create(tmp.path().join("a")).expect("create");
    match writer.write_weight(0, "w", Dtype::Bf16, &[3, 2], &[0; 10]) {
        Err(ArtifactError::WeightSizeMismatch {
            expected, found, ..
        }) => {
            assert_eq!(expected, "12");
            assert_eq!(found, 10);
        }
        other => panic!("expected WeightSizeMismatch, got {other:?}"),
    }
    assert!(matches!(
        writer.write_weight(0, "../w", Dtype::F32, &[1], &[0; 4]),
        Err(ArtifactError::InvalidName { .. })
    ));
    writer
        .write_weight(0, "w", Dtype::F32, &[1], &[0; 4])
        .expect("weight");
    assert!(matches!(
        writer.write_weight(1, "w", Dtype::F32, &[1], &[0; 4]),
        Err(ArtifactError::Duplicate { .. })
    ));
}

#[test]
fn finish_refuses_a_program_that_disagrees_with_the_contract() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let reference = fixture::write(&tmp.path().join("reference")).manifest;

    let dir = tmp.path().join("a");
    let mut writer = ArtifactWriter::create(&dir).expect("create");
    for (i, w) in reference.weights.iter().enumerate() {
        let bytes = std::fs::read(tmp.path().join("reference").join(&w.file)).unwrap();
        writer
            .write_weight(i, &w.slot, w.dtype, &w.dims, &bytes)
            .expect("weight");
    }
    writer
        .write_tokenizer_file("tokenizer.json", fixture::TOKENIZER_JSON)
        .expect("tokenizer");
    for entry in &reference.entries {
        let text = match entry.kind {
            tlaloc_artifact::EntryKind::Decode => fixture::DECODE_BODY,
            tlaloc_artifact::EntryKind::Prefill => fixture::PREFILL_BODY,
        };
        assert_eq!(writer.write_body(text).expect("body"), entry.body);
        let mut sig = ProgramSignature::expected_for(&reference, entry);
        if entry.kind == tlaloc_artifact::EntryKind::Prefill {
            sig.outputs[0].dtype = Dtype::Bf16;
        }
        writer.write_program(&sig).expect("program");
    }
    match writer.finish(&reference) {
        Err(ArtifactError::ProgramSignatureMismatch {
            entry, mismatch, ..
        }) => {
            assert!(entry.starts_with("prefill"), "{entry}");
            assert_eq!(mismatch.field, "outputs[0] (logits).dtype");
        }
        other => panic!("expected ProgramSignatureMismatch, got {other:?}"),
    }
    assert!(!dir.join(MANIFEST_FILE).exists());
}
