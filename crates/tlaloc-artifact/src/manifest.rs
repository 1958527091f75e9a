//! The manifest `tlaloc-serving.json`: serde types in camelCase JSON, and the consistency
//! checks between its parts that need no file access.
//!
//! Field order is struct order and every collection is a `Vec`, so serialization is stable and
//! two exports with the same inputs are byte-identical.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::error::ArtifactError;
use crate::executables::ExecutableSet;
use crate::ladder::{EntryKind, Ladder, LadderPoint};
use crate::paths;
use crate::quant::BlockFormat;
use crate::step::StepInput;
use crate::tensor_parallel::{self, TensorParallel, WeightShard, WeightSplit};

/// The manifest format this crate reads and writes.
/// Version 2 added the `nextTokenIds` output; version 3 the `nextPositions`, `nextSeqLens` and
/// `nextSlotMapping` outputs; version 4 donates a decode entry's carried step inputs to the
/// outputs that carry them ([`StepInput::donated_to`]).
pub const FORMAT_VERSION: u32 = 4;

/// File name of the manifest inside an artifact directory.
pub const MANIFEST_FILE: &str = "tlaloc-serving.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub model: ManifestModel,
    /// Weights and activations.
    pub dtype: Dtype,
    pub kv_cache: KvCacheLayout,
    /// How every program is split over several devices ([`crate::tensor_parallel`]); absent
    /// for a program of one device (degree 1), so artifacts without it read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<TensorParallel>,
    pub ladder: Ladder,
    pub entries: Vec<Entry>,
    pub padding: PaddingContract,
    pub weights: Vec<WeightEntry>,
    pub tokenizer: ManifestTokenizer,
    pub provenance: Provenance,
    /// Serialized executables per compiler identity (`tlaloc compile`); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executables: Vec<ExecutableSet>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestModel {
    /// As exported by the checkpoint, e.g. `LlamaForCausalLM`.
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<ManifestRopeScaling>,
    pub tied_embeddings: bool,
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "lowercase",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum ManifestRopeScaling {
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// Layout of the paged KV cache: one K and one V pool per layer, each
/// `[numBlocks, blockSize, numKvHeads, headDim]`. Block `scratchBlock` (0) is never allocated;
/// padded rows write there.
///
/// Pools of a quantized code dtype (i8, f8e4m3fn) carry `scales`: beside each K and V pool,
/// one f32 scale per written token and KV head (`[numBlocks, blockSize, numKvHeads]`), so
/// element `x` of a row is stored as the code `q = x / s` with `s = absmax(row) / codeMax`
/// and read back as `q * s`. The other pool dtypes have no `scales`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvCacheLayout {
    pub dtype: Dtype,
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scratch_block: usize,
    /// The scales of quantized pools; absent for f32 and bf16 pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<KvScales>,
}

/// The scales beside quantized K/V pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvScales {
    /// Always f32.
    pub dtype: Dtype,
    pub granularity: KvScaleGranularity,
}

/// Which elements share one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KvScaleGranularity {
    /// Each written token's row of one KV head (`headDim` elements) has its own scale, set
    /// when the token is written and never changed after.
    PerTokenHead,
}

impl KvScales {
    /// The one scale layout the format knows.
    pub const PER_TOKEN_HEAD: KvScales = KvScales {
        dtype: Dtype::F32,
        granularity: KvScaleGranularity::PerTokenHead,
    };
}

impl std::fmt::Display for KvScaleGranularity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvScaleGranularity::PerTokenHead => "perTokenHead",
        })
    }
}

impl KvCacheLayout {
    /// The layout for `model` with `num_blocks` blocks (scratch block included) of `block_size`;
    /// a quantized `dtype` gets per-token-and-head f32 scales.
    pub fn for_model(
        model: &ManifestModel,
        dtype: Dtype,
        block_size: usize,
        num_blocks: usize,
    ) -> KvCacheLayout {
        KvCacheLayout {
            dtype,
            num_layers: model.num_layers,
            num_blocks,
            block_size,
            num_kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            scratch_block: 0,
            scales: dtype.is_kv_code_dtype().then_some(KvScales::PER_TOKEN_HEAD),
        }
    }

    /// Pages a pool of `num_blocks` blocks can give to sequences: all but the scratch block.
    pub fn allocatable_blocks_of(num_blocks: usize) -> usize {
        num_blocks.saturating_sub(1)
    }

    /// Pages this pool can give to sequences: all but the scratch block.
    pub fn allocatable_blocks(&self) -> usize {
        Self::allocatable_blocks_of(self.num_blocks)
    }

    /// Dims of each layer's K (and V) pool.
    pub fn pool_dims(&self) -> Vec<usize> {
        vec![
            self.num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        ]
    }

    /// Dims of each layer's K (and V) scale pool, where the pools are quantized.
    pub fn scale_dims(&self) -> Option<Vec<usize>> {
        self.scales.map(|s| match s.granularity {
            KvScaleGranularity::PerTokenHead => {
                vec![self.num_blocks, self.block_size, self.num_kv_heads]
            }
        })
    }

    /// Bytes one token of context takes over every layer's K and V pools, scales included.
    pub fn bytes_per_token(&self) -> u64 {
        let codes = self.num_kv_heads * self.head_dim * self.dtype.byte_size();
        let scales = self
            .scales
            .map_or(0, |s| self.num_kv_heads * s.dtype.byte_size());
        (2 * self.num_layers * (codes + scales)) as u64
    }

    /// Bytes of every pool together (scratch block included): what the runtime allocates.
    pub fn total_bytes(&self) -> u64 {
        self.bytes_per_token() * (self.num_blocks * self.block_size) as u64
    }
}

/// One compiled program for one ladder point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub batch: usize,
    pub tokens: usize,
    pub context: usize,
    /// `bodies/<sha256>.mlir`: the portable body, pure StableHLO that every plugin compiles.
    pub body: String,
    /// `programs/<name>.json`
    pub program: String,
    /// Bodies of the same function that need something of the plugin (see [`BodyVariant`]);
    /// absent when there are none, so an artifact without variants reads as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<BodyVariant>,
}

/// Another body of an entry: the same program signature and the same function as the portable
/// body, written with custom calls that only some plugins can compile (the runtime's own
/// kernels, registered through the plugin's FFI extension; later Triton kernels). The loader
/// uses one when the plugin in hand has everything it requires, and the portable body
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BodyVariant {
    /// What it is called in logs, `inspect` and `--kernels` (see [`crate::kernels`]).
    pub name: String,
    /// The platform whose plugins can compile it, as the client names it (`cpu`, `cuda`).
    pub platform: String,
    /// The custom-call targets it calls, each of which the runtime must have registered with
    /// the plugin before compiling it.
    pub kernels: Vec<String>,
    /// `bodies/<sha256>.mlir`
    pub body: String,
}

impl Entry {
    /// The entry for `point` whose StableHLO text lives at `body` (as returned by the writer).
    pub fn new(point: LadderPoint, body: String) -> Entry {
        let name = point.name();
        Entry {
            program: paths::program_path(&name),
            name,
            kind: point.kind,
            batch: point.batch,
            tokens: point.tokens,
            context: point.context,
            body,
            variants: Vec::new(),
        }
    }

    /// The variant called `name`.
    pub fn variant(&self, name: &str) -> Option<&BodyVariant> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// Every body of the entry: the portable one, then each variant's.
    pub fn bodies(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.body.as_str()).chain(self.variants.iter().map(|v| v.body.as_str()))
    }

    /// This entry as the runtime runs it: the same entry with `body` (one of [`Self::bodies`])
    /// in place of the portable body.
    pub fn with_body(&self, body: &str) -> Entry {
        Entry {
            body: body.to_owned(),
            ..self.clone()
        }
    }

    pub fn point(&self) -> LadderPoint {
        LadderPoint {
            kind: self.kind,
            batch: self.batch,
            tokens: self.tokens,
            context: self.context,
        }
    }
}

/// Values that fill a dead row or token. Format version 1 fixes them; see
/// [`PaddingContract::CONTRACT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaddingContract {
    pub token_ids: i32,
    pub positions: i32,
    /// Block 0 is the scratch block.
    pub block_tables: i32,
    /// Never 0: a zero length masks every key and the softmax becomes 0/0.
    pub seq_lens: i32,
    /// An out-of-bounds scatter index is dropped, so a dead token writes nothing.
    pub slot_mapping: i32,
}

impl PaddingContract {
    /// The step contract's padding values ([`StepInput::padding`]), as the manifest states them.
    pub const CONTRACT: PaddingContract = PaddingContract {
        token_ids: StepInput::TokenIds.padding(),
        positions: StepInput::Positions.padding(),
        block_tables: StepInput::BlockTables.padding(),
        seq_lens: StepInput::SeqLens.padding(),
        slot_mapping: StepInput::SlotMapping.padding(),
    };
}

impl Default for PaddingContract {
    fn default() -> Self {
        Self::CONTRACT
    }
}

/// One weight slot: a raw little-endian, dense row-major file with no header, or, split over
/// the devices of a tensor-parallel artifact, one such file per device (`split`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightEntry {
    /// e.g. `layers.3.qkv_proj`
    pub slot: String,
    /// e.g. `weights/0012_layers.3.qkv_proj.bin`; empty (and absent from the JSON) for a split
    /// weight, whose files are its shards'.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// The stored element type: f32 or bf16, or u8 for a block-quantized weight.
    pub dtype: Dtype,
    /// The logical dims (`[out, in]` elements for a block-quantized weight, whatever its
    /// bytes).
    pub dims: Vec<usize>,
    /// Bytes of the whole weight (of every shard together, for a split weight).
    pub byte_length: u64,
    /// The sha256 of `file`; empty (and absent from the JSON) for a split weight, whose shards
    /// each carry their own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The block format of a block-quantized weight (its file and operand are the raw blocks,
    /// see [`crate::quant`]); absent for dense weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_format: Option<BlockFormat>,
    /// In a tensor-parallel artifact, how the weight is split over the devices (shard `k` of
    /// `dims` along `split.axis` on device `k`); absent for a weight every device takes whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<WeightSplit>,
}

impl WeightEntry {
    /// The files this weight is stored in, with their lengths and hashes: its one file, or its
    /// shards in device order.
    pub fn stored_files(&self) -> Vec<WeightShard> {
        match &self.split {
            None => vec![WeightShard {
                file: self.file.clone(),
                byte_length: self.byte_length,
                sha256: self.sha256.clone(),
            }],
            Some(split) => split.shards.clone(),
        }
    }

    /// The program operand this weight is: `(dtype, dims)` as stored, i.e. `u8 [out, row
    /// bytes]` for a block-quantized weight and the dense `(dtype, dims)` otherwise. `None` for
    /// a block-quantized weight whose dims its format cannot store (refused by validation).
    pub fn operand(&self) -> Option<(Dtype, Vec<usize>)> {
        match self.block_format {
            None => Some((self.dtype, self.dims.clone())),
            Some(format) => Some((
                BlockFormat::OPERAND_DTYPE,
                format.operand_dims(&self.dims).ok()?,
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestTokenizer {
    pub files: Vec<TokenizerFile>,
    /// Whether `tokenizer_config.json` carries a chat template; `null` when there is no config.
    pub chat_template: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenizerFile {
    /// e.g. `tokenizer.json`
    pub name: String,
    /// e.g. `tokenizer/tokenizer.json`
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Provenance {
    pub source: SourceCheckpoint,
    /// `tlaloc-export <version>`
    pub exporter: String,
    /// The export options, as a JSON object.
    pub options: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceCheckpoint {
    /// e.g. `safetensors` or `gguf`
    pub kind: String,
    pub files: Vec<ManifestSourceFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestSourceFile {
    pub name: String,
    pub sha256: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::InvalidManifest {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Manifest {
    /// Checks everything that can be checked without reading other files: the ladder, the KV
    /// layout against the model and the ladder, the padding contract, entries against the
    /// ladder (each point exactly once), path shapes, and weight byte lengths against dims.
    pub fn validate(&self) -> Result<(), ArtifactError> {
        if self.format_version != FORMAT_VERSION {
            return Err(ArtifactError::UnsupportedFormatVersion {
                found: u64::from(self.format_version),
                supported: FORMAT_VERSION,
            });
        }
        self.validate_model()?;
        if !self.dtype.is_model_dtype() {
            return Err(invalid(
                "dtype",
                format!("{} is not a model dtype; use f32 or bf16", self.dtype),
            ));
        }
        self.ladder
            .validate()
            .map_err(|source| ArtifactError::InvalidLadder { source })?;
        self.validate_kv_cache()?;
        self.validate_tensor_parallel()?;
        if self.padding != PaddingContract::CONTRACT {
            return Err(invalid(
                "padding",
                format!(
                    "{:?} differs from the format's contract {:?}",
                    self.padding,
                    PaddingContract::CONTRACT
                ),
            ));
        }
        self.validate_entries()?;
        self.validate_weights()?;
        self.validate_tokenizer()?;
        crate::executables::validate(self)?;
        if !self.provenance.options.is_object() {
            return Err(invalid("provenance.options", "must be a JSON object"));
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), ArtifactError> {
        let m = &self.model;
        for (field, value) in [
            ("model.hiddenSize", m.hidden_size),
            ("model.intermediateSize", m.intermediate_size),
            ("model.numLayers", m.num_layers),
            ("model.numHeads", m.num_heads),
            ("model.numKvHeads", m.num_kv_heads),
            ("model.headDim", m.head_dim),
            ("model.vocabSize", m.vocab_size),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        if m.num_heads % m.num_kv_heads != 0 {
            return Err(invalid(
                "model.numKvHeads",
                format!(
                    "{} does not divide numHeads {}",
                    m.num_kv_heads, m.num_heads
                ),
            ));
        }
        Ok(())
    }

    fn validate_kv_cache(&self) -> Result<(), ArtifactError> {
        let kv = &self.kv_cache;
        let m = &self.model;
        if !kv.dtype.is_kv_dtype() {
            return Err(invalid(
                "kvCache.dtype",
                format!(
                    "{} is not supported for KV pools; use f32, bf16, i8 or f8e4m3fn",
                    kv.dtype
                ),
            ));
        }
        match (kv.dtype.is_kv_code_dtype(), kv.scales) {
            (true, None) => {
                return Err(invalid(
                    "kvCache.scales",
                    format!("{} pools need scales; none are stated", kv.dtype),
                ));
            }
            (false, Some(_)) => {
                return Err(invalid(
                    "kvCache.scales",
                    format!("{} pools take no scales", kv.dtype),
                ));
            }
            (true, Some(scales)) if scales.dtype != Dtype::F32 => {
                return Err(invalid(
                    "kvCache.scales.dtype",
                    format!("{} is not f32, the only scale dtype", scales.dtype),
                ));
            }
            _ => {}
        }
        for (field, found, expected, source) in [
            (
                "kvCache.numLayers",
                kv.num_layers,
                m.num_layers,
                "model.numLayers",
            ),
            (
                "kvCache.numKvHeads",
                kv.num_kv_heads,
                m.num_kv_heads,
                "model.numKvHeads",
            ),
            ("kvCache.headDim", kv.head_dim, m.head_dim, "model.headDim"),
            (
                "kvCache.blockSize",
                kv.block_size,
                self.ladder.block_size,
                "ladder.blockSize",
            ),
        ] {
            if found != expected {
                return Err(invalid(
                    field,
                    format!("{found} differs from {source} {expected}"),
                ));
            }
        }
        if kv.scratch_block != 0 {
            return Err(invalid(
                "kvCache.scratchBlock",
                format!(
                    "{} is not 0, the only scratch block the format knows",
                    kv.scratch_block
                ),
            ));
        }
        let required = 1 + self.ladder.max_context / self.ladder.block_size;
        if kv.num_blocks < required {
            return Err(invalid(
                "kvCache.numBlocks",
                format!(
                    "{} blocks cannot hold one sequence of maxContext {} plus the scratch block; at least {required} are needed",
                    kv.num_blocks, self.ladder.max_context
                ),
            ));
        }
        Ok(())
    }

    fn validate_entries(&self) -> Result<(), ArtifactError> {
        let mut names = BTreeSet::new();
        let mut points = BTreeSet::new();
        let expected: BTreeSet<LadderPoint> = self.ladder.points().into_iter().collect();
        for (i, entry) in self.entries.iter().enumerate() {
            let field = format!("entries[{i}] ({})", entry.name);
            paths::check_name(&entry.name).map_err(|reason| invalid(&field, reason))?;
            if !names.insert(entry.name.as_str()) {
                return Err(invalid(field, "entry name appears twice"));
            }
            let point = entry.point();
            if !expected.contains(&point) {
                return Err(invalid(
                    field,
                    format!(
                        "{} batch {} tokens {} context {} is not a point of the ladder",
                        point.kind, point.batch, point.tokens, point.context
                    ),
                ));
            }
            if !points.insert(point) {
                return Err(invalid(field, "ladder point appears twice"));
            }
            let program = paths::program_path(&entry.name);
            if entry.program != program {
                return Err(invalid(
                    format!("{field}.program"),
                    format!("{:?} should be {program:?}", entry.program),
                ));
            }
            paths::body_hash(&entry.body)
                .map_err(|reason| invalid(format!("{field}.body"), reason))?;
            let mut names = BTreeSet::new();
            for (v, variant) in entry.variants.iter().enumerate() {
                let field = format!("{field}.variants[{v}] ({})", variant.name);
                crate::kernels::check_variant_name(&variant.name)
                    .map_err(|reason| invalid(format!("{field}.name"), reason))?;
                if !names.insert(variant.name.as_str()) {
                    return Err(invalid(field, "variant name appears twice in one entry"));
                }
                if variant.platform.is_empty()
                    || !variant
                        .platform
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(invalid(
                        format!("{field}.platform"),
                        format!(
                            "{:?} is not a platform name (letters, digits, `_`, `-`)",
                            variant.platform
                        ),
                    ));
                }
                paths::body_hash(&variant.body)
                    .map_err(|reason| invalid(format!("{field}.body"), reason))?;
                if variant.body == entry.body {
                    return Err(invalid(
                        format!("{field}.body"),
                        "is the portable body; a variant is a different body",
                    ));
                }
            }
        }
        if let Some(missing) = expected.difference(&points).next() {
            return Err(invalid(
                "entries",
                format!("no entry for ladder point {}", missing.name()),
            ));
        }
        Ok(())
    }

    fn validate_weights(&self) -> Result<(), ArtifactError> {
        let mut slots = BTreeSet::new();
        for (i, w) in self.weights.iter().enumerate() {
            let field = format!("weights[{i}] ({})", w.slot);
            if !slots.insert(w.slot.as_str()) {
                return Err(invalid(field, "slot appears twice"));
            }
            let length = match w.block_format {
                None if !w.dtype.is_model_dtype() => {
                    return Err(invalid(
                        format!("{field}.dtype"),
                        format!("{} is not a weight dtype; use f32 or bf16", w.dtype),
                    ));
                }
                None => w.dtype.byte_length(&w.dims),
                Some(format) => {
                    if w.dtype != BlockFormat::OPERAND_DTYPE {
                        return Err(invalid(
                            format!("{field}.dtype"),
                            format!(
                                "a {format} weight is stored as {}, not {}",
                                BlockFormat::OPERAND_DTYPE,
                                w.dtype
                            ),
                        ));
                    }
                    format
                        .operand_dims(&w.dims)
                        .map_err(|reason| invalid(format!("{field}.dims"), reason))?;
                    format.byte_length(&w.dims)
                }
            };
            match length {
                Some(len) if len == w.byte_length => {}
                expected => {
                    return Err(invalid(
                        format!("{field}.byteLength"),
                        format!(
                            "{} disagrees with {} dims {:?} ({})",
                            w.byte_length,
                            w.dtype,
                            w.dims,
                            expected.map_or("overflow".to_owned(), |l| format!("{l} bytes")),
                        ),
                    ));
                }
            }
            self.validate_weight_files(&field, w)?;
        }
        Ok(())
    }

    fn validate_tensor_parallel(&self) -> Result<(), ArtifactError> {
        let Some(tp) = self.tensor_parallel else {
            return Ok(());
        };
        let m = &self.model;
        if tp.degree < 2 {
            return Err(invalid(
                "tensorParallel.degree",
                format!(
                    "{} is not a split over devices; an artifact of one device has no tensorParallel section",
                    tp.degree
                ),
            ));
        }
        if m.num_kv_heads % tp.degree != 0 || m.num_heads % tp.degree != 0 {
            return Err(invalid(
                "tensorParallel.degree",
                format!(
                    "{} does not divide the {} KV heads and {} attention heads the pools and \
                     programs are split over",
                    tp.degree, m.num_kv_heads, m.num_heads
                ),
            ));
        }
        Ok(())
    }

    /// A whole weight's file and hash, or a split weight's shards: as many as the degree, each
    /// a piece of equal length that the split's axis allows.
    fn validate_weight_files(&self, field: &str, w: &WeightEntry) -> Result<(), ArtifactError> {
        let Some(split) = &w.split else {
            return paths::check_sha256(&w.sha256)
                .map_err(|reason| invalid(format!("{field}.sha256"), reason));
        };
        let Some(TensorParallel { degree }) = self.tensor_parallel else {
            return Err(invalid(
                format!("{field}.split"),
                "a split weight needs a tensorParallel section",
            ));
        };
        if !w.file.is_empty() || !w.sha256.is_empty() {
            return Err(invalid(
                field,
                "a split weight names its files in split.shards, not in file and sha256",
            ));
        }
        tensor_parallel::shard_dims(&w.dims, w.block_format, split.axis, degree)
            .map_err(|reason| invalid(format!("{field}.split.axis"), reason))?;
        if split.shards.len() != degree {
            return Err(invalid(
                format!("{field}.split.shards"),
                format!(
                    "{} shards for tensorParallel degree {degree}; one per device is needed",
                    split.shards.len()
                ),
            ));
        }
        let piece = w.byte_length / degree as u64;
        for (k, shard) in split.shards.iter().enumerate() {
            let field = format!("{field}.split.shards[{k}]");
            if shard.byte_length != piece {
                return Err(invalid(
                    format!("{field}.byteLength"),
                    format!(
                        "{} is not 1/{degree} of the weight's byteLength {}",
                        shard.byte_length, w.byte_length
                    ),
                ));
            }
            paths::check_sha256(&shard.sha256)
                .map_err(|reason| invalid(format!("{field}.sha256"), reason))?;
        }
        Ok(())
    }

    fn validate_tokenizer(&self) -> Result<(), ArtifactError> {
        let mut names = BTreeSet::new();
        for (i, f) in self.tokenizer.files.iter().enumerate() {
            let field = format!("tokenizer.files[{i}] ({})", f.name);
            if !names.insert(f.name.as_str()) {
                return Err(invalid(field, "file name appears twice"));
            }
            paths::check_sha256(&f.sha256)
                .map_err(|reason| invalid(format!("{field}.sha256"), reason))?;
        }
        Ok(())
    }

    /// Devices each program runs on: the `tensorParallel` degree, 1 without the section.
    pub fn tensor_parallel_degree(&self) -> usize {
        self.tensor_parallel.map_or(1, |tp| tp.degree)
    }

    /// The entry compiled for `point`, if any.
    pub fn entry_for(&self, point: &LadderPoint) -> Option<&Entry> {
        self.entries.iter().find(|e| e.point() == *point)
    }

    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    pub fn weight(&self, slot: &str) -> Option<&WeightEntry> {
        self.weights.iter().find(|w| w.slot == slot)
    }

    /// Pretty JSON with a trailing newline: the exact bytes of `tlaloc-serving.json`.
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        crate::paths::pretty_json(self)
    }
}
