//! A tensor-parallel artifact: split weights stored one file per device, read back shard by
//! shard, hashed by `verify` file by file, and the manifest's `tensorParallel` section checked
//! against the model; an artifact without the section is of degree 1.

use std::path::Path;

use tlaloc_artifact::{
    Artifact, ArtifactError, ArtifactWriter, Dtype, Entry, EntryKind, FORMAT_VERSION,
    IntegrityProblem, KvCacheLayout, Manifest, ManifestTokenizer, PaddingContract,
    ProgramSignature, Provenance, SourceCheckpoint, TensorParallel,
};

use crate::fixture::{self, DECODE_BODY, PREFILL_BODY, edit_manifest, weight_values};

/// The fixture's shapes with two KV heads, over two devices: the embedding split over its rows
/// (the vocabulary), one projection over its columns, one weight replicated.
fn write_split(dir: &Path) -> (Manifest, Vec<Vec<u8>>) {
    let mut model = fixture::model();
    model.num_kv_heads = 2;
    let ladder = fixture::ladder();
    let mut writer = ArtifactWriter::create(dir).unwrap();
    let embed = weight_values(10 * 4, 0.5);
    let qkv = weight_values(4 * 4, -1.0);
    let norm = weight_values(4, 2.0);
    let weights = vec![
        writer
            .write_split_weight(
                0,
                "embed_tokens",
                Dtype::F32,
                &[10, 4],
                None,
                (0, 2),
                &embed,
            )
            .unwrap(),
        writer
            .write_split_weight(
                1,
                "layers.0.o_proj",
                Dtype::F32,
                &[4, 4],
                None,
                (1, 2),
                &qkv,
            )
            .unwrap(),
        writer
            .write_weight(2, "final_norm", Dtype::F32, &[4], &norm)
            .unwrap(),
    ];
    let mut manifest = Manifest {
        format_version: FORMAT_VERSION,
        kv_cache: KvCacheLayout::for_model(&model, Dtype::F32, ladder.block_size, 9),
        tensor_parallel: Some(TensorParallel { degree: 2 }),
        model,
        dtype: Dtype::F32,
        ladder: ladder.clone(),
        entries: Vec::new(),
        padding: PaddingContract::CONTRACT,
        weights,
        tokenizer: ManifestTokenizer {
            files: Vec::new(),
            chat_template: None,
        },
        provenance: Provenance {
            source: SourceCheckpoint {
                kind: "safetensors".into(),
                files: Vec::new(),
            },
            exporter: "tlaloc-export 0.1.0".into(),
            options: serde_json::json!({}),
        },
        executables: Vec::new(),
    };
    for point in ladder.points() {
        let text = match point.kind {
            EntryKind::Decode => DECODE_BODY,
            EntryKind::Prefill => PREFILL_BODY,
        };
        let body = writer.write_body(text).unwrap();
        manifest.entries.push(Entry::new(point, body));
    }
    for entry in &manifest.entries {
        writer
            .write_program(&ProgramSignature::expected_for(&manifest, entry))
            .unwrap();
    }
    writer.finish(&manifest).unwrap();
    (manifest, vec![embed, qkv, norm])
}

/// Columns `[k * 2, k * 2 + 2)` of a row-major `4 x 4` f32 matrix's bytes.
fn columns(bytes: &[u8], k: usize) -> Vec<u8> {
    bytes
        .chunks(16)
        .flat_map(|row| row[k * 8..k * 8 + 8].to_vec())
        .collect()
}

#[test]
fn split_weights_are_stored_one_file_per_device_and_read_back_by_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tp");
    let (_, bytes) = write_split(&dir);
    let artifact = Artifact::open(&dir).unwrap();
    let manifest = artifact.manifest();
    assert_eq!(manifest.tensor_parallel_degree(), 2);
    let embed = manifest.weight("embed_tokens").unwrap();
    let split = embed.split.as_ref().unwrap();
    assert_eq!(split.axis, 0);
    assert_eq!(
        split
            .shards
            .iter()
            .map(|s| s.file.as_str())
            .collect::<Vec<_>>(),
        [
            "weights/0000_embed_tokens.shard0.bin",
            "weights/0000_embed_tokens.shard1.bin"
        ]
    );
    assert_eq!(embed.byte_length, 160);
    // Rows 0..5 on device 0, rows 5..10 on device 1.
    assert_eq!(
        artifact.weight_shard_bytes("embed_tokens", 0).unwrap(),
        bytes[0][..80]
    );
    assert_eq!(
        artifact.weight_shard_bytes("embed_tokens", 1).unwrap(),
        bytes[0][80..]
    );
    for k in 0..2 {
        assert_eq!(
            artifact.weight_shard_bytes("layers.0.o_proj", k).unwrap(),
            columns(&bytes[1], k)
        );
        // A replicated weight is the whole file on every device.
        assert_eq!(
            artifact.weight_shard_bytes("final_norm", k).unwrap(),
            bytes[2]
        );
    }
    assert!(matches!(
        artifact.weight_shard_bytes("final_norm", 2),
        Err(ArtifactError::UnknownShard {
            shard: 2,
            degree: 2,
            ..
        })
    ));
    match artifact.weight_bytes("embed_tokens") {
        Err(e @ ArtifactError::WeightIsSplit { .. }) => {
            assert!(e.to_string().contains("shard by shard"), "{e}")
        }
        other => panic!("reading a split weight whole: {other:?}"),
    }
    // The JSON names a split weight's files in its shards only.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(tlaloc_artifact::MANIFEST_FILE)).unwrap())
            .unwrap();
    assert_eq!(json["tensorParallel"], serde_json::json!({"degree": 2}));
    let row = &json["weights"][0];
    assert!(
        row.get("file").is_none() && row.get("sha256").is_none(),
        "{row}"
    );
    assert_eq!(row["split"]["shards"][1]["byteLength"], 80);
    assert!(json["weights"][2].get("split").is_none());

    // verify hashes every shard, and names the one that changed.
    let report = artifact.verify().unwrap();
    assert_eq!(
        report.bytes,
        160 + 64 + 16 + (DECODE_BODY.len() + PREFILL_BODY.len()) as u64
    );
    let shard = dir.join("weights/0001_layers.0.o_proj.shard1.bin");
    let mut changed = std::fs::read(&shard).unwrap();
    changed[0] ^= 1;
    std::fs::write(&shard, changed).unwrap();
    match artifact.verify() {
        Err(ArtifactError::IntegrityFailed { problems }) => {
            let files: Vec<&str> = problems.iter().map(IntegrityProblem::file).collect();
            assert_eq!(files, ["weights/0001_layers.0.o_proj.shard1.bin"]);
        }
        other => panic!("a changed shard passed verify: {other:?}"),
    }
}

#[test]
fn the_tensor_parallel_section_is_checked_against_the_model_and_the_shards() {
    let refused = |edit: &dyn Fn(&mut serde_json::Value), needle: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tp");
        write_split(&dir);
        edit_manifest(&dir, edit);
        let err = Artifact::open(&dir).expect_err("an inconsistent split was accepted");
        let text = err.to_string();
        assert!(
            text.contains(needle),
            "{text:?} does not mention {needle:?}"
        );
    };
    refused(
        &|m| m["tensorParallel"]["degree"] = 4.into(),
        "4 does not divide the 2 KV heads and 2 attention heads",
    );
    refused(
        &|m| m["tensorParallel"]["degree"] = 1.into(),
        "no tensorParallel section",
    );
    refused(
        &|m| {
            m.as_object_mut().unwrap().remove("tensorParallel");
        },
        "a split weight needs a tensorParallel section",
    );
    refused(
        &|m| {
            m["weights"][0]["split"]["shards"]
                .as_array_mut()
                .unwrap()
                .pop();
        },
        "1 shards for tensorParallel degree 2",
    );
    refused(
        &|m| m["weights"][1]["split"]["axis"] = 2.into(),
        "weights[1] (layers.0.o_proj).split.axis",
    );
    refused(
        &|m| m["weights"][0]["split"]["shards"][1]["byteLength"] = 81.into(),
        "is not 1/2 of the weight's byteLength 160",
    );
    refused(
        &|m| m["weights"][0]["split"]["shards"][1]["file"] = "../escape.bin".into(),
        "split.shards[1].file",
    );
}

#[test]
fn an_artifact_without_the_section_is_of_degree_one() {
    let (_tmp, dir, written) = fixture::written();
    assert_eq!(written.manifest.tensor_parallel, None);
    assert_eq!(written.artifact.manifest().tensor_parallel_degree(), 1);
    let json = std::fs::read_to_string(dir.join(tlaloc_artifact::MANIFEST_FILE)).unwrap();
    assert!(
        !json.contains("tensorParallel") && !json.contains("split"),
        "{json}"
    );
    for (slot, bytes) in &written.weights {
        assert_eq!(
            &written.artifact.weight_shard_bytes(slot, 0).unwrap(),
            bytes
        );
    }
}
