//! Checkpoint -> artifact: opens a checkpoint, converts its weights to the export dtype, builds
//! the RoPE tables and the forward program of every ladder entry, checks each program against
//! the contract (`ProgramSignature::expected_for`) before writing it, and writes the manifest
//! with provenance through `tlaloc_artifact::ArtifactWriter`.
//!
//! Output is a pure function of the checkpoint bytes and the options: weights in plan order,
//! entries in ladder order, bodies content-addressed, no timestamps, so two exports are
//! byte-identical. Matrix weights take the export dtype; norm weights, biases and the RoPE
//! tables stay f32 (they are small and the graph computes with them in f32). A fused slot
//! (q/k/v, gate/up and their biases) is its checkpoint tensors' rows written one after the
//! other: dense row-major `[out, in]` tensors concatenate along the output dimension by
//! concatenating their bytes. With `keep_quantized`, a GGUF matrix whose every source tensor
//! is Q8_0 (or every one Q4_0, or Q4_1) is written as its blocks instead (`tlaloc_artifact::quant`): the rows of blocks of
//! its tensors one after the other, Q/K rows unpermuted whole. With `tensor_parallel` N > 1
//! the programs are annotated for N devices, fused slots split over their rows are written
//! shard-major, and each split weight is written as N shard files (`crate::tensor_parallel`,
//! `tlaloc_artifact::tensor_parallel`).

use std::path::Path;

use half::bf16;
use tlaloc_artifact::kernels;
use tlaloc_artifact::{
    ArtifactError, ArtifactWriter, BlockFormat, BodyVariant, Dtype, Entry, ExistingDir,
    FORMAT_VERSION, KvCacheLayout, Ladder, LadderError, LadderOptions, Manifest, ManifestModel,
    ManifestRopeScaling, ManifestSourceFile, ManifestTokenizer, OperandRole, PaddingContract,
    ProgramSignature, Provenance, SignatureMismatch, SourceCheckpoint, TensorParallel, TensorSpec,
};
use tlaloc_hlo::Module;

use crate::checkpoint::{Checkpoint, SourceKind};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::IngestError;
use crate::graph::{self, BodyKind, GraphError, SlotSource, WeightPlan};
use crate::tensor_parallel::{self, TensorParallelError};

/// What an export produces and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportOptions {
    /// f32 or bf16: the dtype of the matrix weights (and of the KV pools, unless `kv_dtype`).
    pub dtype: Dtype,
    /// The K/V pools' dtype: f32, bf16, i8 or f8e4m3fn (the quantized two with f32 scales);
    /// `None` takes `dtype`.
    pub kv_dtype: Option<Dtype>,
    pub ladder: LadderOptions,
    /// Replace an existing artifact in the output directory.
    pub force: bool,
    /// Give each entry of at most [`tlaloc_artifact::kernels::CPU_VARIANT_MAX_ROWS`] rows a
    /// `cpu` body variant whose matrix multiplications call the runtime's host kernel
    /// ([`tlaloc_artifact::kernels::CPU_MATMUL`]) instead of XLA's.
    pub cpu_variant: bool,
    /// Store each matrix weight whose every source tensor is Q8_0 (or every one Q4_0, Q4_1 or Q5_0) in a
    /// GGUF checkpoint as its raw blocks (`tlaloc_artifact::quant`), dequantized in the graph
    /// (in an f32 export the `cpu` variant passes the blocks as they are to the kernel
    /// [`tlaloc_artifact::kernels::cpu_matmul_blocks`] names) rather than at export. Every other weight is stored as without
    /// it.
    pub keep_quantized: bool,
    /// Round the input of every matrix multiplication against a kept block weight to 8-bit
    /// codes per 32-element block (llama.cpp's arithmetic for these formats), in the portable
    /// body's graph and in the `cpu` variant's kernels
    /// ([`tlaloc_artifact::kernels::cpu_matmul_blocks_xq8`]), which then multiply integers.
    /// Needs `keep_quantized` and an f32 export.
    pub quantize_activations: bool,
    /// Devices every program is split over (Megatron-style tensor parallelism through XLA's
    /// SPMD partitioner, see [`crate::tensor_parallel`]); 1, the default, for programs of one
    /// device. Must divide the model's attention and KV heads, its intermediate size and its
    /// vocabulary.
    pub tensor_parallel: usize,
}

impl ExportOptions {
    /// The K/V pools' dtype: `kv_dtype`, or the weights' dtype.
    pub fn kv_dtype(&self) -> Dtype {
        self.kv_dtype.unwrap_or(self.dtype)
    }
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            dtype: Dtype::F32,
            kv_dtype: None,
            ladder: LadderOptions::default(),
            force: false,
            cpu_variant: false,
            keep_quantized: false,
            quantize_activations: false,
            tensor_parallel: 1,
        }
    }
}

/// Progress reported while exporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportProgress {
    /// Starting: how many weights and entries there will be.
    Plan { weights: usize, entries: usize },
    /// Weight `index` (of the plan) has been written.
    Weight {
        index: usize,
        slot: String,
        bytes: u64,
    },
    /// Entry `index` (of the ladder) has been built and written.
    Entry { index: usize, name: String },
}

/// What was written.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    pub manifest: Manifest,
    pub entries: usize,
    /// Distinct bodies written (entries may share one).
    pub bodies: usize,
    pub weight_bytes: u64,
    pub body_bytes: u64,
}

/// Why an export was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error("export dtype {0} is not supported; use f32 or bf16")]
    UnsupportedDtype(Dtype),
    #[error("K/V pool dtype {0} is not supported; use f32, bf16, i8 or f8e4m3fn")]
    UnsupportedKvDtype(Dtype),
    #[error(
        "quantized activations need weights kept as blocks and an f32 export; this export has {0} (add --keep-quantized and --dtype f32, or drop --quantize-activations)"
    )]
    QuantizedActivationsNeedKeptF32(String),
    #[error(transparent)]
    Ladder(#[from] LadderError),
    #[error(transparent)]
    TensorParallel(#[from] TensorParallelError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("entry {entry}: the built program disagrees with the contract at {mismatch}")]
    Contract {
        entry: String,
        mismatch: SignatureMismatch,
    },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(
        "weight slot {slot}: tensor {tensor:?} is {format} but cannot be kept quantized: {reason}"
    )]
    UnsupportedBlockWeight {
        slot: String,
        tensor: String,
        format: BlockFormat,
        reason: String,
    },
}

/// Exports the checkpoint at `checkpoint` (a Hugging Face directory or a `.gguf` file) into
/// the artifact directory `out`.
pub fn export(
    checkpoint: impl AsRef<Path>,
    out: impl AsRef<Path>,
    options: &ExportOptions,
    progress: &mut dyn FnMut(ExportProgress),
) -> Result<ExportSummary, ExportError> {
    // Refused before the checkpoint is read; export_checkpoint checks the same for its callers.
    checked_ladder(options)?;
    let checkpoint = Checkpoint::open(checkpoint)?;
    export_checkpoint(&checkpoint, out, options, progress)
}

/// The options' dtype (f32 or bf16) checked and their ladder built: what every export
/// refuses before it reads a tensor.
fn checked_ladder(options: &ExportOptions) -> Result<Ladder, ExportError> {
    if !matches!(options.dtype, Dtype::F32 | Dtype::Bf16) {
        return Err(ExportError::UnsupportedDtype(options.dtype));
    }
    let kv_dtype = options.kv_dtype();
    if !kv_dtype.is_kv_dtype() {
        return Err(ExportError::UnsupportedKvDtype(kv_dtype));
    }
    if options.quantize_activations && (!options.keep_quantized || options.dtype != Dtype::F32) {
        let kept = if options.keep_quantized {
            "weights kept as blocks"
        } else {
            "no weights kept as blocks"
        };
        return Err(ExportError::QuantizedActivationsNeedKeptF32(format!(
            "{kept}, dtype {}",
            options.dtype
        )));
    }
    match options.tensor_parallel {
        0 => return Err(TensorParallelError::Zero.into()),
        degree if degree > 1 && options.cpu_variant => {
            return Err(TensorParallelError::CpuVariant { degree }.into());
        }
        _ => {}
    }
    Ok(options.ladder.ladder()?)
}

/// Exports an already opened checkpoint into the artifact directory `out`.
pub fn export_checkpoint(
    checkpoint: &Checkpoint,
    out: impl AsRef<Path>,
    options: &ExportOptions,
    progress: &mut dyn FnMut(ExportProgress),
) -> Result<ExportSummary, ExportError> {
    let ladder = checked_ladder(options)?;
    let config = &checkpoint.config;
    let mut plan = WeightPlan::new(config, options.dtype, ladder.max_context);
    if options.keep_quantized {
        keep_blocks(checkpoint, &mut plan)?;
    }
    plan.quantize_activations = options.quantize_activations;
    tensor_parallel::apply(&mut plan, options.tensor_parallel)?;
    let tp = plan.tensor_parallel;
    let model = artifact_model(config);
    let kv = KvCacheLayout::for_model(
        &model,
        options.kv_dtype(),
        ladder.block_size,
        options.ladder.num_blocks,
    );
    let points = ladder.points();
    progress(ExportProgress::Plan {
        weights: plan.slots.len(),
        entries: points.len(),
    });

    let existing = if options.force {
        ExistingDir::ReplaceArtifact
    } else {
        ExistingDir::Refuse
    };
    let mut writer = ArtifactWriter::create_with(out, existing)?;

    let mut weights = Vec::with_capacity(plan.slots.len());
    let mut weight_bytes = 0u64;
    let rope = graph::rope::tables(
        config.rope_theta,
        config.head_dim,
        &config.rope_scaling,
        plan.rope_positions,
    );
    for (index, slot) in plan.slots.iter().enumerate() {
        // A fused slot split over its rows is written shard-major (crate::tensor_parallel).
        let fused_shards = if slot.split == Some(0) { tp } else { 1 };
        if let (Some(format), SlotSource::Rows(roles)) = (slot.block, &slot.source) {
            let mut parts = Vec::with_capacity(roles.len());
            for &role in roles {
                let blocks = checkpoint.stored_blocks(role)?.ok_or_else(|| {
                    ExportError::UnsupportedBlockWeight {
                        slot: slot.name.clone(),
                        tensor: role.to_string(),
                        format,
                        reason: "the checkpoint stores no blocks".into(),
                    }
                })?;
                parts.push(blocks.bytes);
            }
            let bytes = tensor_parallel::shard_major(&parts, fused_shards);
            let row = match slot.split {
                None => writer.write_block_weight(index, &slot.name, format, &slot.dims, &bytes)?,
                Some(axis) => writer.write_split_weight(
                    index,
                    &slot.name,
                    slot.dtype,
                    &slot.dims,
                    Some(format),
                    (axis, tp),
                    &bytes,
                )?,
            };
            weight_bytes += row.byte_length;
            progress(ExportProgress::Weight {
                index,
                slot: slot.name.clone(),
                bytes: row.byte_length,
            });
            weights.push(row);
            continue;
        }
        let values = match &slot.source {
            SlotSource::Rows(roles) => {
                let mut parts = Vec::with_capacity(roles.len());
                for &role in roles {
                    parts.push(checkpoint.tensor(role)?.to_f32());
                }
                tensor_parallel::shard_major(&parts, fused_shards)
            }
            SlotSource::RopeCos => rope.0.clone(),
            SlotSource::RopeSin => rope.1.clone(),
            SlotSource::LocalRopeCos | SlotSource::LocalRopeSin => {
                let theta = config.local_rope_theta.unwrap_or(config.rope_theta);
                let (cos, sin) = graph::rope::tables(
                    theta,
                    config.head_dim,
                    &crate::config::RopeScaling::None,
                    plan.rope_positions,
                );
                if slot.source == SlotSource::LocalRopeCos {
                    cos
                } else {
                    sin
                }
            }
        };
        let bytes = encode(&values, slot.dtype)?;
        let row = match slot.split {
            None => writer.write_weight(index, &slot.name, slot.dtype, &slot.dims, &bytes)?,
            Some(axis) => writer.write_split_weight(
                index,
                &slot.name,
                slot.dtype,
                &slot.dims,
                None,
                (axis, tp),
                &bytes,
            )?,
        };
        weight_bytes += row.byte_length;
        progress(ExportProgress::Weight {
            index,
            slot: slot.name.clone(),
            bytes: row.byte_length,
        });
        weights.push(row);
    }

    let mut files = Vec::new();
    for (name, bytes) in checkpoint.tokenizer.files() {
        files.push(writer.write_tokenizer_file(name, bytes)?);
    }
    files.push(crate::hf_config::write_hf_config(
        &mut writer,
        &model,
        options.dtype,
    )?);
    let tokenizer = ManifestTokenizer {
        files,
        chat_template: Some(checkpoint.tokenizer.chat_template().is_some()),
    };

    let mut manifest = Manifest {
        format_version: FORMAT_VERSION,
        model,
        dtype: options.dtype,
        kv_cache: kv.clone(),
        tensor_parallel: (tp > 1).then_some(TensorParallel { degree: tp }),
        ladder: ladder.clone(),
        entries: Vec::new(),
        padding: PaddingContract::CONTRACT,
        weights,
        tokenizer,
        provenance: provenance(checkpoint, options),
        executables: Vec::new(),
    };

    let mut bodies = std::collections::BTreeMap::new();
    for (index, point) in points.iter().enumerate() {
        let entry_stub = Entry::new(*point, String::new());
        let expected = ProgramSignature::expected_for(&manifest, &entry_stub);
        let mut write = |kind: BodyKind| -> Result<(String, Vec<String>), ExportError> {
            let module = graph::forward_program(&plan, &kv, *point, kind)?;
            signature_of(&module, &expected)
                .check_against(&expected)
                .map_err(|mismatch| ExportError::Contract {
                    entry: point.name(),
                    mismatch,
                })?;
            let text = module.to_text();
            let body = writer.write_body(&text)?;
            bodies.insert(body.clone(), text.len() as u64);
            Ok((body, kernels_called(&text)))
        };
        let mut entry = Entry::new(*point, write(BodyKind::Portable)?.0);
        if options.cpu_variant && point.batch * point.tokens <= kernels::CPU_VARIANT_MAX_ROWS {
            let (body, kernels) = write(BodyKind::Cpu)?;
            entry.variants.push(BodyVariant {
                name: kernels::CPU_VARIANT.to_owned(),
                platform: kernels::CPU_PLATFORM.to_owned(),
                kernels,
                body,
            });
        }
        writer.write_program(&expected)?;
        manifest.entries.push(entry);
        progress(ExportProgress::Entry {
            index,
            name: point.name(),
        });
    }

    let artifact = writer.finish(&manifest)?;
    Ok(ExportSummary {
        manifest: artifact.manifest().clone(),
        entries: manifest.entries.len(),
        bodies: bodies.len(),
        weight_bytes,
        body_bytes: bodies.values().sum(),
    })
}

/// Marks every matrix slot of `plan` whose source tensors are all stored in one block format
/// the graph reads (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) to be written as those blocks; refuses by
/// name one the format cannot store (a row that is not whole blocks).
fn keep_blocks(checkpoint: &Checkpoint, plan: &mut WeightPlan) -> Result<(), ExportError> {
    use crate::gguf::GgmlType;
    let formats = [
        (GgmlType::Q8_0.name(), BlockFormat::Q8_0),
        (GgmlType::Q4_0.name(), BlockFormat::Q4_0),
        (GgmlType::Q4_1.name(), BlockFormat::Q4_1),
        (GgmlType::Q5_0.name(), BlockFormat::Q5_0),
        (GgmlType::Q4_K.name(), BlockFormat::Q4_K),
        (GgmlType::Q6_K.name(), BlockFormat::Q6_K),
    ];
    for slot in &mut plan.slots {
        let SlotSource::Rows(roles) = &slot.source else {
            continue;
        };
        if slot.dims.len() != 2 || checkpoint.source.kind != SourceKind::Gguf {
            continue;
        }
        let first = checkpoint.meta(roles[0])?;
        let Some(&(ggml_name, format)) = formats.iter().find(|(name, _)| *name == first.dtype)
        else {
            continue;
        };
        let mut all = true;
        for &role in roles {
            all &= checkpoint.meta(role)?.dtype == ggml_name;
        }
        if !all {
            continue;
        }
        if let Err(reason) = format.operand_dims(&slot.dims) {
            return Err(ExportError::UnsupportedBlockWeight {
                slot: slot.name.clone(),
                tensor: first.name.clone(),
                format,
                reason,
            });
        }
        slot.block = Some(format);
    }
    Ok(())
}

/// The kernels the body `text` calls, in [`kernels::KERNELS`] order.
fn kernels_called(text: &str) -> Vec<String> {
    kernels::KERNELS
        .iter()
        .filter(|(target, _)| text.contains(&format!("call_target_name = \"{target}\"")))
        .map(|(target, _)| (*target).to_owned())
        .collect()
}

/// Dense little-endian bytes of `values` as `dtype` (bf16 rounds to nearest even).
fn encode(values: &[f32], dtype: Dtype) -> Result<Vec<u8>, ExportError> {
    let mut bytes = Vec::with_capacity(values.len() * dtype.byte_size());
    match dtype {
        Dtype::F32 => {
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::Bf16 => {
            for &v in values {
                bytes.extend_from_slice(&bf16::from_f32(v).to_le_bytes());
            }
        }
        other => return Err(ExportError::UnsupportedDtype(other)),
    }
    Ok(bytes)
}

/// The signature `module` actually has, named and typed from its arguments and results, with
/// roles taken from `expected` by name (a name the contract lacks keeps a weight role and so
/// fails the comparison).
fn signature_of(module: &Module, expected: &ProgramSignature) -> ProgramSignature {
    let spec_of = |name: String, ty: &tlaloc_hlo::TensorType, known: &[TensorSpec]| {
        let role = known
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.role.clone())
            .unwrap_or(OperandRole::Weight { slot: name.clone() });
        TensorSpec {
            role,
            dtype: graph::artifact_dtype(ty.dtype).unwrap_or(Dtype::U8),
            dims: ty.dims.clone(),
            name,
        }
    };
    let inputs = module
        .arguments()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let name = a.name.clone().unwrap_or_else(|| format!("arg{i}"));
            spec_of(name, &a.ty, &expected.inputs)
        })
        .collect();
    let outputs = module
        .result_types()
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            let name = expected
                .outputs
                .get(i)
                .map_or_else(|| format!("result{i}"), |s| s.name.clone());
            spec_of(name, ty, &expected.outputs)
        })
        .collect();
    let donations = module
        .arguments()
        .iter()
        .enumerate()
        .filter_map(|(input, a)| {
            a.aliasing_output
                .map(|output| tlaloc_artifact::Donation { input, output })
        })
        .collect();
    ProgramSignature {
        entry: expected.entry.clone(),
        inputs,
        outputs,
        donations,
    }
}

/// The manifest's model section.
fn artifact_model(c: &ModelConfig) -> ManifestModel {
    ManifestModel {
        architecture: c.architecture.hf_name().to_owned(),
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        num_layers: c.num_hidden_layers,
        num_heads: c.num_attention_heads,
        num_kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        vocab_size: c.vocab_size,
        rms_norm_eps: c.rms_norm_eps,
        rope_theta: c.rope_theta,
        rope_scaling: match c.rope_scaling {
            RopeScaling::None => None,
            RopeScaling::Linear { factor } => Some(ManifestRopeScaling::Linear { factor }),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => Some(ManifestRopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }),
        },
        tied_embeddings: c.tie_word_embeddings,
        attention_bias: c.qkv_bias,
        max_position_embeddings: c.max_position_embeddings,
        bos_token_id: c.bos_token_id,
        eos_token_ids: c.eos_token_ids.clone(),
    }
}

fn provenance(checkpoint: &Checkpoint, options: &ExportOptions) -> Provenance {
    let kind = match checkpoint.source.kind {
        SourceKind::Safetensors | SourceKind::ShardedSafetensors => "safetensors",
        SourceKind::Gguf => "gguf",
    };
    let l = &options.ladder;
    Provenance {
        source: SourceCheckpoint {
            kind: kind.to_owned(),
            files: checkpoint
                .source
                .files
                .iter()
                .map(|f| ManifestSourceFile {
                    name: f.name.clone(),
                    sha256: f.sha256.clone(),
                })
                .collect(),
        },
        exporter: format!("tlaloc-export {}", env!("CARGO_PKG_VERSION")),
        options: {
            let mut json = serde_json::json!({
                "dtype": options.dtype.name(),
                "maxBatch": l.max_batch,
                "maxContext": l.max_context,
                "blockSize": l.block_size,
                "numBlocks": l.num_blocks,
                "prefillChunks": l.prefill_chunks,
            });
            // Stated only when chosen, so exports without it stay byte-identical to before.
            if let Some(kv_dtype) = options.kv_dtype {
                json["kvDtype"] = kv_dtype.name().into();
            }
            if options.keep_quantized {
                json["keepQuantized"] = true.into();
            }
            if options.quantize_activations {
                json["quantizeActivations"] = "q8_0-blocks".into();
            }
            if options.tensor_parallel > 1 {
                json["tensorParallel"] = options.tensor_parallel.into();
            }
            if !l.prefill_batch_buckets.is_empty() {
                json["prefillBatchBuckets"] = l.prefill_batch_buckets.clone().into();
            }
            json
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tlaloc_artifact::{EntryKind, LadderPoint};

    use super::*;

    /// A block-quantized slot whose rows are not whole blocks is refused before anything is
    /// built, naming the slot, the format and the width.
    #[test]
    fn a_block_weight_of_partial_blocks_is_refused_by_name() {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures/tiny-llama-gqa");
        let checkpoint = Checkpoint::open(fixture).unwrap();
        let config = &checkpoint.config;
        let mut plan = WeightPlan::new(config, Dtype::F32, 128);
        let kv = KvCacheLayout::for_model(&artifact_model(config), Dtype::F32, 16, 9);
        let point = LadderPoint {
            kind: EntryKind::Decode,
            batch: 1,
            tokens: 1,
            context: 128,
        };
        let slot = plan
            .slots
            .iter_mut()
            .find(|s| s.name == "layers.1.o_proj")
            .unwrap();
        slot.block = Some(BlockFormat::Q8_0);
        slot.dims[1] = 48;
        for kind in [BodyKind::Portable, BodyKind::Cpu] {
            let err = graph::forward_program(&plan, &kv, point, kind).unwrap_err();
            assert!(
                matches!(&err, GraphError::UnsupportedBlockWeight { slot, .. } if slot == "layers.1.o_proj"),
                "{err}"
            );
            let text = err.to_string();
            assert!(text.contains("q8_0") && text.contains("48"), "{text}");
        }
        // Whole blocks are accepted.
        let slot = plan
            .slots
            .iter_mut()
            .find(|s| s.name == "layers.1.o_proj")
            .unwrap();
        slot.dims[1] = config.num_attention_heads * config.head_dim;
        assert!(graph::forward_program(&plan, &kv, point, BodyKind::Cpu).is_ok());
    }

    #[test]
    fn the_kernels_a_body_calls_are_read_off_its_text() {
        let text = format!(
            "stablehlo.custom_call ... call_target_name = \"{}\" ...",
            kernels::CPU_MATMUL_Q8_0
        );
        assert_eq!(kernels_called(&text), [kernels::CPU_MATMUL_Q8_0]);
        assert!(kernels_called("no calls").is_empty());
    }
}
