//! A small synthetic artifact: a two-layer model with tiny dims, three f32 weight files, two
//! hand-written bodies shared by the entries, and one tokenizer file.

use std::path::{Path, PathBuf};

use tlaloc_artifact::{
    Artifact, ArtifactWriter, Dtype, Entry, EntryKind, FORMAT_VERSION, KvCacheLayout, Ladder,
    Manifest, ManifestModel, ManifestRopeScaling, ManifestSourceFile, ManifestTokenizer,
    PaddingContract, ProgramSignature, Provenance, SourceCheckpoint,
};

pub const DECODE_BODY: &str =
    "module @decode {\n  func.func public @main() {\n    return\n  }\n}\n";
pub const PREFILL_BODY: &str =
    "module @prefill {\n  func.func public @main() {\n    return\n  }\n}\n";
pub const TOKENIZER_JSON: &[u8] = b"{\"model\": {\"type\": \"BPE\"}}\n";

pub fn ladder() -> Ladder {
    Ladder {
        max_batch: 2,
        max_context: 32,
        block_size: 8,
        batch_buckets: vec![1, 2],
        context_buckets: vec![16, 32],
        prefill_chunks: vec![8, 16],
        prefill_batch_buckets: vec![1],
    }
}

pub fn model() -> ManifestModel {
    ManifestModel {
        architecture: "LlamaForCausalLM".into(),
        hidden_size: 4,
        intermediate_size: 8,
        num_layers: 2,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 2,
        vocab_size: 10,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: Some(ManifestRopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        tied_embeddings: true,
        attention_bias: false,
        max_position_embeddings: 64,
        bos_token_id: Some(1),
        eos_token_ids: vec![2, 3],
    }
}

/// Deterministic weight bytes: `dims` f32 values `i * 0.25 + seed`.
pub fn weight_values(count: usize, seed: f32) -> Vec<u8> {
    (0..count)
        .flat_map(|i| (i as f32 * 0.25 + seed).to_le_bytes())
        .collect()
}

pub struct Written {
    pub manifest: Manifest,
    pub artifact: Artifact,
    /// `(slot, bytes)` as handed to the writer.
    pub weights: Vec<(String, Vec<u8>)>,
}

/// Writes the fixture artifact into `dir` (which must be empty or missing).
pub fn write(dir: &Path) -> Written {
    write_with(dir, ladder())
}

/// Writes the fixture artifact over `ladder` (one entry per point) into `dir`.
pub fn write_with(dir: &Path, ladder: Ladder) -> Written {
    let mut writer = ArtifactWriter::create(dir).expect("create writer");
    let weight_specs: [(&str, Vec<usize>, f32); 3] = [
        ("embed_tokens", vec![10, 4], 0.5),
        ("layers.0.qkv_proj", vec![4, 4], -1.0),
        ("layers.1.qkv_proj", vec![4, 4], 2.0),
    ];
    let mut weights = Vec::new();
    let mut weight_entries = Vec::new();
    for (index, (slot, dims, seed)) in weight_specs.into_iter().enumerate() {
        let bytes = weight_values(dims.iter().product(), seed);
        weight_entries.push(
            writer
                .write_weight(index, slot, Dtype::F32, &dims, &bytes)
                .expect("write weight"),
        );
        weights.push((slot.to_owned(), bytes));
    }
    let tokenizer_file = writer
        .write_tokenizer_file("tokenizer.json", TOKENIZER_JSON)
        .expect("write tokenizer");

    let mut manifest = Manifest {
        format_version: FORMAT_VERSION,
        model: model(),
        dtype: Dtype::F32,
        kv_cache: KvCacheLayout::for_model(&model(), Dtype::F32, ladder.block_size, 9),
        tensor_parallel: None,
        ladder: ladder.clone(),
        entries: Vec::new(),
        padding: PaddingContract::CONTRACT,
        weights: weight_entries,
        tokenizer: ManifestTokenizer {
            files: vec![tokenizer_file],
            chat_template: None,
        },
        provenance: Provenance {
            source: SourceCheckpoint {
                kind: "safetensors".into(),
                files: vec![ManifestSourceFile {
                    name: "model.safetensors".into(),
                    sha256: "0".repeat(64),
                }],
            },
            exporter: "tlaloc-export 0.1.0".into(),
            options: serde_json::json!({"maxBatch": 2, "dtype": "f32"}),
        },
        executables: Vec::new(),
    };
    for point in ladder.points() {
        let text = match point.kind {
            EntryKind::Decode => DECODE_BODY,
            EntryKind::Prefill => PREFILL_BODY,
        };
        let body = writer.write_body(text).expect("write body");
        manifest.entries.push(Entry::new(point, body));
    }
    for entry in &manifest.entries {
        writer
            .write_program(&ProgramSignature::expected_for(&manifest, entry))
            .expect("write program");
    }
    let artifact = writer.finish(&manifest).expect("finish");
    Written {
        manifest,
        artifact,
        weights,
    }
}

/// A fresh temporary directory with the fixture written into `<tmp>/artifact`.
pub fn written() -> (tempfile::TempDir, PathBuf, Written) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("artifact");
    let written = write(&dir);
    (tmp, dir, written)
}

/// Rewrites the manifest JSON through `edit`.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    edit_json(&dir.join(tlaloc_artifact::MANIFEST_FILE), edit);
}

pub fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("read json")).expect("parse json");
    edit(&mut value);
    std::fs::write(path, serde_json::to_vec_pretty(&value).expect("print json"))
        .expect("write json");
}
