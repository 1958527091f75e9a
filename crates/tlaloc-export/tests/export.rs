//! The exporter's own contract: byte-identical re-exports, refusals by name, programs that
//! the loader accepts, and `verify` naming a corrupted file.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use tlaloc_artifact::{Artifact, ArtifactError, Dtype, LadderError, LadderOptions};
use tlaloc_export::{ExportError, ExportOptions, IngestError, export};

fn small_ladder() -> LadderOptions {
    LadderOptions::full_pool(2, 128, 16, vec![16, 64])
}

fn options(dtype: Dtype, ladder: LadderOptions) -> ExportOptions {
    ExportOptions {
        dtype,
        kv_dtype: None,
        ladder,
        force: false,
        cpu_variant: false,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    }
}

/// Every file under `dir`, relative path -> bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

#[test]
fn two_exports_are_byte_identical() {
    for (fixture, dtype) in [
        ("tiny-llama-tied", Dtype::F32),
        ("tiny-qwen2-bias", Dtype::Bf16),
    ] {
        let a = support::scratch_dir(&format!("export-same-a-{fixture}"));
        let b = support::scratch_dir(&format!("export-same-b-{fixture}"));
        let opts = options(dtype, small_ladder());
        let src = support::fixture(fixture);
        export(&src, &a, &opts, &mut |_| {}).unwrap();
        export(&src, &b, &opts, &mut |_| {}).unwrap();
        let (ta, tb) = (tree(&a), tree(&b));
        assert_eq!(
            ta.keys().collect::<Vec<_>>(),
            tb.keys().collect::<Vec<_>>(),
            "{fixture}: file lists differ"
        );
        for (name, bytes) in &ta {
            assert!(
                bytes == &tb[name],
                "{fixture}: {name} differs between exports"
            );
        }
        // A different option changes the artifact (the comparison above can fail).
        let c = support::scratch_dir(&format!("export-same-c-{fixture}"));
        let mut other = small_ladder();
        other.num_blocks += 1;
        export(&src, &c, &options(dtype, other), &mut |_| {}).unwrap();
        assert_ne!(
            tree(&c),
            ta,
            "{fixture}: num_blocks did not reach the artifact"
        );
    }
}

#[test]
fn export_writes_what_the_manifest_promises() {
    let out = support::scratch_dir("export-contents");
    let mut events = Vec::new();
    let summary = export(
        support::fixture("tiny-llama-tied"),
        &out,
        &options(Dtype::Bf16, small_ladder()),
        &mut |e| events.push(e),
    )
    .unwrap();
    let artifact = Artifact::open(&out).unwrap();
    let m = artifact.manifest();
    // Ladder: decode b1, b2 at context 128; prefill chunks 16 and 64 at 128.
    assert_eq!(summary.entries, 4);
    assert_eq!(m.entries.len(), 4);
    for e in &m.entries {
        artifact.program(&e.name).unwrap();
        assert!(
            artifact
                .body_text(e)
                .unwrap()
                .contains("tf.aliasing_output")
        );
    }
    // Tied: no LM head slot; matrices bf16; norms and rope tables f32.
    assert!(m.weight("lm_head").is_none());
    assert_eq!(m.weight("embed_tokens").unwrap().dtype, Dtype::Bf16);
    assert_eq!(m.weight("layers.0.qkv_proj").unwrap().dtype, Dtype::Bf16);
    assert_eq!(m.weight("final_norm").unwrap().dtype, Dtype::F32);
    assert_eq!(
        m.weight("rope.cos").unwrap().dims,
        vec![128, m.model.head_dim]
    );
    assert_eq!(m.kv_cache.dtype, Dtype::Bf16);
    assert_eq!(m.provenance.source.kind, "safetensors");
    assert_eq!(
        m.provenance.options["prefillChunks"],
        serde_json::json!([16, 64])
    );
    assert!(m.tokenizer.files.iter().any(|f| f.name == "tokenizer.json"));
    assert_eq!(m.tokenizer.chat_template, Some(true));
    // Progress covered every weight and every entry.
    let weights = events
        .iter()
        .filter(|e| matches!(e, tlaloc_export::ExportProgress::Weight { .. }))
        .count();
    assert_eq!(weights, m.weights.len());
    assert!(artifact.verify().is_ok());
}

/// A fused slot holds its checkpoint tensors' rows in order (q, k, v; gate, up), byte for
/// byte as the safetensors file stores them, with dims that say so.
#[test]
fn fused_slots_are_the_checkpoint_rows_concatenated() {
    let src = support::fixture("tiny-qwen2-bias");
    let out = support::scratch_dir("export-fused");
    export(
        &src,
        &out,
        &options(Dtype::F32, small_ladder()),
        &mut |_| {},
    )
    .unwrap();
    let artifact = Artifact::open(&out).unwrap();
    let checkpoint = std::fs::read(src.join("model.safetensors")).unwrap();
    let checkpoint = safetensors::SafeTensors::deserialize(&checkpoint).unwrap();
    let layers = artifact.manifest().model.num_layers;
    for layer in 0..layers {
        for (slot, parts) in [
            ("qkv_proj", ["q_proj", "k_proj", "v_proj"].as_slice()),
            ("qkv_bias", ["q_proj", "k_proj", "v_proj"].as_slice()),
            ("gate_up_proj", ["gate_proj", "up_proj"].as_slice()),
        ] {
            let (module, kind) = match slot {
                "gate_up_proj" => ("mlp", "weight"),
                "qkv_bias" => ("self_attn", "bias"),
                _ => ("self_attn", "weight"),
            };
            let mut expected_bytes = Vec::new();
            let mut expected_rows = 0;
            let mut trailing = Vec::new();
            for part in parts {
                let t = checkpoint
                    .tensor(&format!("model.layers.{layer}.{module}.{part}.{kind}"))
                    .unwrap();
                assert_eq!(t.dtype(), safetensors::Dtype::F32);
                expected_bytes.extend_from_slice(t.data());
                expected_rows += t.shape()[0];
                trailing = t.shape()[1..].to_vec();
            }
            let name = format!("layers.{layer}.{slot}");
            let row = artifact.manifest().weight(&name).unwrap();
            let mut dims = vec![expected_rows];
            dims.extend(trailing);
            assert_eq!(row.dims, dims, "{name}");
            assert!(
                artifact.weight_bytes(&name).unwrap() == expected_bytes,
                "{name}: bytes are not the checkpoint rows in order"
            );
        }
    }
}

#[test]
fn verify_names_a_corrupted_file() {
    let out = support::scratch_dir("export-corrupt");
    export(
        support::fixture("tiny-llama-gqa"),
        &out,
        &options(Dtype::F32, small_ladder()),
        &mut |_| {},
    )
    .unwrap();
    let artifact = Artifact::open(&out).unwrap();
    let weight = artifact
        .manifest()
        .weight("layers.1.qkv_proj")
        .unwrap()
        .clone();
    let path = out.join(&weight.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let err = artifact.verify().unwrap_err();
    assert!(matches!(err, ArtifactError::IntegrityFailed { .. }));
    assert!(err.to_string().contains(&weight.file), "{err}");
}

#[test]
fn block_size_that_does_not_divide_the_context_is_refused() {
    let mut ladder = small_ladder();
    ladder.block_size = 24;
    ladder.num_blocks = 100;
    let err = export(
        support::fixture("tiny-llama-gqa"),
        support::scratch_dir("export-bad-block"),
        &options(Dtype::F32, ladder),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ExportError::Ladder(LadderError::BlockSizeDoesNotDivideContext {
                block_size: 24,
                context: 128
            })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("block size 24 does not divide context 128")
    );
}

#[test]
fn unsupported_export_dtype_is_refused() {
    let err = export(
        support::fixture("tiny-llama-gqa"),
        support::scratch_dir("export-bad-dtype"),
        &options(Dtype::F16, small_ladder()),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(err, ExportError::UnsupportedDtype(Dtype::F16)),
        "{err}"
    );
    assert!(err.to_string().contains("use f32 or bf16"));
}

#[test]
fn yarn_rope_scaling_is_refused_by_name() {
    let src = support::scratch_dir("export-yarn-checkpoint");
    std::fs::create_dir_all(&src).unwrap();
    let fixture = support::fixture("tiny-llama-gqa");
    for name in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(fixture.join(name), src.join(name)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    config["rope_scaling"] = serde_json::json!({
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128
    });
    config["rope_parameters"] = serde_json::Value::Null;
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let out = support::scratch_dir("export-yarn");
    let err = export(
        &src,
        &out,
        &options(Dtype::F32, small_ladder()),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ExportError::Ingest(IngestError::UnsupportedValue { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("yarn"), "{err}");
    assert!(!out.exists(), "a refused export wrote {}", out.display());
}

#[test]
fn existing_output_is_refused_unless_forced() {
    let out = support::scratch_dir("export-existing");
    let src = support::fixture("tiny-llama-gqa");
    let mut opts = options(Dtype::F32, small_ladder());
    export(&src, &out, &opts, &mut |_| {}).unwrap();
    let err = export(&src, &out, &opts, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            ExportError::Artifact(ArtifactError::DirectoryNotEmpty { .. })
        ),
        "{err}"
    );
    opts.force = true;
    export(&src, &out, &opts, &mut |_| {}).unwrap();
}

#[test]
fn the_hugging_face_config_agrees_with_the_checkpoints_own() {
    let out = support::scratch_dir("export-hf-config");
    export(
        support::fixture("tiny-llama-tied"),
        &out,
        &options(Dtype::F32, small_ladder()),
        &mut |_| {},
    )
    .unwrap();
    let artifact = Artifact::open(&out).unwrap();
    let m = artifact.manifest();
    let file = m
        .tokenizer
        .files
        .iter()
        .find(|f| f.name == tlaloc_artifact::hf_config::HF_CONFIG_FILE)
        .expect("config.json is a tokenizer file of the manifest");
    let bytes = std::fs::read(out.join(&file.path)).unwrap();
    tlaloc_artifact::hf_config::check_hf_config(m, &bytes).unwrap();
    // The checkpoint's own config.json is the reference for every field both carry.
    let ours: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let source: serde_json::Value = serde_json::from_slice(
        &std::fs::read(support::fixture("tiny-llama-tied").join("config.json")).unwrap(),
    )
    .unwrap();
    for field in [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
    ] {
        let want = source.get(field).expect("the fixture states it");
        if want.is_number() {
            assert_eq!(ours[field].as_f64(), want.as_f64(), "{field}");
        } else {
            assert_eq!(&ours[field], want, "{field}");
        }
    }
    assert_eq!(ours["architectures"], source["architectures"]);
    assert_eq!(ours["rope_theta"], source["rope_parameters"]["rope_theta"]);
    // A file that disagrees is refused by name.
    let mut wrong = ours.clone();
    wrong["num_hidden_layers"] = serde_json::json!(99);
    let err =
        tlaloc_artifact::hf_config::check_hf_config(m, wrong.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("num_hidden_layers"), "{err}");
}

/// The CPU variant adds a second body to exactly the entries of at most
/// `CPU_VARIANT_MAX_ROWS` rows, each calling the host matmul wherever the portable body has
/// a projection or the LM head and the host attention once per layer, and changes nothing
/// else: the portable bodies, programs and weights are the files of an export without it, and
/// two exports with it are identical.
#[test]
fn the_cpu_variant_adds_kernel_bodies_to_entries_of_few_rows_and_nothing_else() {
    use tlaloc_artifact::kernels::{
        CPU_MATMUL, CPU_PAGED_ATTENTION, CPU_PLATFORM, CPU_VARIANT, CPU_VARIANT_MAX_ROWS,
    };
    let src = support::fixture("tiny-llama-gqa");
    // Prefill chunks of 16 (16 rows: a variant) and 64 (none).
    let plain = support::scratch_dir("export-cpu-variant-plain");
    export(
        &src,
        &plain,
        &options(Dtype::F32, small_ladder()),
        &mut |_| {},
    )
    .unwrap();
    let with = ExportOptions {
        cpu_variant: true,
        keep_quantized: false,
        ..options(Dtype::F32, small_ladder())
    };
    let a = support::scratch_dir("export-cpu-variant-a");
    let b = support::scratch_dir("export-cpu-variant-b");
    export(&src, &a, &with, &mut |_| {}).unwrap();
    export(&src, &b, &with, &mut |_| {}).unwrap();
    assert!(tree(&a) == tree(&b), "two exports with the variant differ");

    let artifact = Artifact::open(&a).unwrap();
    artifact.verify().unwrap();
    let manifest = artifact.manifest();
    let plain_manifest = Artifact::open(&plain).unwrap().manifest().clone();
    let layers = manifest.model.num_layers;
    let (mut with_variant, mut without) = (0, 0);
    for (entry, plain_entry) in manifest.entries.iter().zip(&plain_manifest.entries) {
        assert_eq!(
            entry.body, plain_entry.body,
            "{}: portable body changed",
            entry.name
        );
        let rows = entry.batch * entry.tokens;
        match entry.variant(CPU_VARIANT) {
            Some(v) => {
                assert!(rows <= CPU_VARIANT_MAX_ROWS, "{}: {rows} rows", entry.name);
                assert_eq!(v.platform, CPU_PLATFORM);
                assert_eq!(v.kernels, [CPU_MATMUL, CPU_PAGED_ATTENTION]);
                let text = artifact.body_text(&entry.with_body(&v.body)).unwrap();
                let calls = |target: &str| {
                    text.matches(&format!("call_target_name = \"{target}\""))
                        .count()
                };
                // qkv, o, gate_up and down per layer, and the LM head; attention once per
                // layer, reading the pools in place: no dot_general and no page gather left.
                assert_eq!(calls(CPU_MATMUL), 4 * layers + 1, "{}", entry.name);
                assert_eq!(calls(CPU_PAGED_ATTENTION), layers, "{}", entry.name);
                let portable = artifact.body_text(entry).unwrap();
                assert_eq!(portable.matches("custom_call").count(), 0);
                assert_eq!(
                    portable.matches("stablehlo.dot_general").count(),
                    4 * layers + 1 + 2 * layers,
                    "{}",
                    entry.name
                );
                assert_eq!(
                    text.matches("stablehlo.dot_general").count(),
                    0,
                    "{}",
                    entry.name
                );
                // The embedding's row gather and the RoPE tables' remain; the pages' do not.
                assert!(
                    text.matches("stablehlo.gather").count()
                        < portable.matches("stablehlo.gather").count(),
                    "{}",
                    entry.name
                );
                with_variant += 1;
            }
            None => {
                assert!(
                    rows > CPU_VARIANT_MAX_ROWS,
                    "{}: {rows} rows, no variant",
                    entry.name
                );
                without += 1;
            }
        }
    }
    assert!(
        with_variant > 0 && without > 0,
        "{with_variant} with, {without} without"
    );
    let (ta, tp) = (tree(&a), tree(&plain));
    for (name, bytes) in &tp {
        if name != tlaloc_artifact::MANIFEST_FILE {
            assert!(
                ta.get(name) == Some(bytes),
                "{name} differs from the export without the variant"
            );
        }
    }
}
