//! `tlaloc export`: a checkpoint (Hugging Face directory or `.gguf` file) into an artifact
//! directory, with a progress bar over weights and entries and a summary at the end.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tlaloc_artifact::{Dtype, LadderOptions};
use tlaloc_export::{ExportOptions, ExportProgress, export};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportDtype {
    F32,
    Bf16,
}

/// The K/V pools' element type.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KvDtype {
    F32,
    Bf16,
    /// i8 codes with one f32 scale per token and KV head.
    Int8,
    /// fp8 e4m3 (`f8E4M3FN`) codes with one f32 scale per token and KV head; loads only on a
    /// plugin that compiles the type.
    Fp8,
}

/// A body variant the exporter can add to entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VariantArg {
    /// Matrix multiplications of few rows (decode, short prefill chunks) call the runtime's
    /// host kernel on CPU plugins; other plugins run the portable body.
    Cpu,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A Hugging Face checkpoint directory or a `.gguf` file.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The artifact directory to write (must be missing or empty, unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Dtype of the matrix weights (and of the KV pools, unless --kv-dtype).
    #[arg(long, value_enum, default_value_t = ExportDtype::F32)]
    dtype: ExportDtype,
    /// Dtype of the K/V pools (default: --dtype).
    #[arg(long, value_enum)]
    kv_dtype: Option<KvDtype>,
    /// Largest decode batch.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Largest context (tokens per sequence); a multiple of the block size.
    #[arg(long)]
    max_context: Option<usize>,
    /// Tokens per KV block.
    #[arg(long)]
    block_size: Option<usize>,
    /// KV blocks per layer pool, scratch block included (default: the top batch at the top
    /// context, plus the scratch block).
    #[arg(long)]
    num_blocks: Option<usize>,
    /// Prefill chunk sizes (repeatable or a comma list).
    #[arg(long, value_delimiter = ',')]
    prefill_chunk: Vec<usize>,
    /// How many prompts one prefill step takes, ascending (repeatable or a comma list; default
    /// 1: prompts are prefilled one at a time). Each bucket adds an entry per prefill chunk and
    /// context; at most --max-batch.
    #[arg(long, value_delimiter = ',')]
    prefill_batch_buckets: Vec<usize>,
    /// Decode batch buckets, ascending (default: powers of two up to --max-batch, which
    /// defaults to the largest bucket given here).
    #[arg(long, value_delimiter = ',')]
    batch_buckets: Vec<usize>,
    /// Context buckets, ascending multiples of the block size (default: doubling from 128 up
    /// to --max-context, which defaults to the largest bucket given here).
    #[arg(long, value_delimiter = ',')]
    context_buckets: Vec<usize>,
    /// Replace an existing artifact in --out.
    #[arg(long)]
    force: bool,
    /// Body variants to add beside each entry's portable body (repeatable or a comma list).
    #[arg(long, value_enum, value_delimiter = ',')]
    variants: Vec<VariantArg>,
    /// Keep GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K matrix weights as their blocks (dequantized in the
    /// portable body's graph; read as they are by the CPU variant's kernels in an f32 export)
    /// instead of dequantizing them at export.
    #[arg(long)]
    keep_quantized: bool,
    /// With --keep-quantized (f32): round the input of each matrix multiplication against a
    /// kept block weight to 8-bit codes per 32 elements, as llama.cpp does, so the CPU variant
    /// multiplies integers (faster decode; logits move by the rounding).
    #[arg(long)]
    quantize_activations: bool,
    /// Split every program over this many devices (tensor parallelism: attention heads, the
    /// MLP, the embedding and LM head, and the K/V pools divided between them; XLA inserts the
    /// collectives). Must divide the model's attention and KV heads, its intermediate size and
    /// its vocabulary; 1 is a program of one device.
    #[arg(long, default_value_t = 1, value_name = "N")]
    tensor_parallel: usize,
    /// After exporting, compile every entry with this plugin and ship the executables in the
    /// artifact (as `tlaloc compile`); repeatable, one set per plugin.
    #[arg(long, value_name = "PLUGIN")]
    compile: Vec<String>,
}

impl ExportArgs {
    fn options(&self) -> ExportOptions {
        let defaults = LadderOptions::default();
        let max_batch = self
            .max_batch
            .or(self.batch_buckets.last().copied())
            .unwrap_or(defaults.max_batch);
        let max_context = self
            .max_context
            .or(self.context_buckets.last().copied())
            .unwrap_or(defaults.max_context);
        let block_size = self.block_size.unwrap_or(defaults.block_size);
        let num_blocks = self
            .num_blocks
            .unwrap_or_else(|| 1 + max_batch * max_context.div_ceil(block_size.max(1)));
        let prefill_chunks = if self.prefill_chunk.is_empty() {
            defaults
                .prefill_chunks
                .iter()
                .map(|&c| c.min(max_context))
                .collect()
        } else {
            self.prefill_chunk.clone()
        };
        ExportOptions {
            dtype: match self.dtype {
                ExportDtype::F32 => Dtype::F32,
                ExportDtype::Bf16 => Dtype::Bf16,
            },
            kv_dtype: self.kv_dtype.map(|d| match d {
                KvDtype::F32 => Dtype::F32,
                KvDtype::Bf16 => Dtype::Bf16,
                KvDtype::Int8 => Dtype::I8,
                KvDtype::Fp8 => Dtype::F8E4M3FN,
            }),
            ladder: LadderOptions {
                max_batch,
                max_context,
                block_size,
                num_blocks,
                prefill_chunks,
                prefill_batch_buckets: self.prefill_batch_buckets.clone(),
                batch_buckets: self.batch_buckets.clone(),
                context_buckets: self.context_buckets.clone(),
            },
            force: self.force,
            cpu_variant: self.variants.contains(&VariantArg::Cpu),
            keep_quantized: self.keep_quantized,
            quantize_activations: self.quantize_activations,
            tensor_parallel: self.tensor_parallel,
        }
    }
}

pub fn run(args: ExportArgs) -> Result<()> {
    let options = args.options();
    let start = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .context("progress bar template")?,
    );
    let mut weights_total = 0;
    let summary = export(
        &args.checkpoint,
        &args.out,
        &options,
        &mut |event| match event {
            ExportProgress::Plan { weights, entries } => {
                weights_total = weights;
                bar.set_length((weights + entries) as u64);
                bar.set_message("opening checkpoint");
            }
            ExportProgress::Weight { slot, .. } => {
                bar.inc(1);
                bar.set_message(format!("weight {slot}"));
            }
            ExportProgress::Entry { index, name } => {
                bar.set_position((weights_total + index + 1) as u64);
                bar.set_message(format!("entry {name}"));
            }
        },
    )
    .with_context(|| {
        format!(
            "exporting {} to {}",
            args.checkpoint.display(),
            args.out.display()
        )
    })?;
    bar.finish_and_clear();
    let m = &summary.manifest;
    println!(
        "exported {} ({} layers, hidden {}, vocab {}) as {} to {}",
        m.model.architecture,
        m.model.num_layers,
        m.model.hidden_size,
        m.model.vocab_size,
        m.dtype,
        args.out.display()
    );
    println!(
        "entries: {} ({} distinct bodies, {})",
        summary.entries,
        summary.bodies,
        human_bytes(summary.body_bytes)
    );
    println!(
        "weights: {} slots, {}",
        m.weights.len(),
        human_bytes(summary.weight_bytes)
    );
    println!(
        "ladder: batch {:?}, context {:?}, prefill chunks {:?}, prefill batches {:?}, block size {}, {} blocks",
        m.ladder.batch_buckets,
        m.ladder.context_buckets,
        m.ladder.prefill_chunks,
        m.ladder.prefill_batch_buckets,
        m.kv_cache.block_size,
        m.kv_cache.num_blocks
    );
    println!("KV cache: {}", super::inspect::kv_summary(&m.kv_cache));
    println!("time: {:.2?}", start.elapsed());
    for plugin in &args.compile {
        super::compile::compile_for(
            &args.out,
            plugin,
            tlaloc_runtime::LoadOptions::default().compile_cache,
            Default::default(),
        )?;
    }
    Ok(())
}

/// Bytes in binary units, e.g. `513.2 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
