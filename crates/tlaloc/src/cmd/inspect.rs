//! `tlaloc inspect PATH`: an artifact directory's manifest summary (model, ladder, entries,
//! weight bytes), or for a checkpoint, first what it is (architecture, tensors per element type)
//! and whether export accepts it, then, when it does, its full description. Both come from the
//! ingestion crate; a refused checkpoint is reported, not an error of the command.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tlaloc_artifact::{Artifact, MANIFEST_FILE};
use tlaloc_export::{Survey, describe};

use super::export::human_bytes;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// An artifact directory, a Hugging Face checkpoint directory or a `.gguf` file.
    path: PathBuf,
}

pub fn run(args: InspectArgs) -> Result<()> {
    if args.path.join(MANIFEST_FILE).is_file() {
        let artifact = Artifact::open(&args.path)
            .with_context(|| format!("opening artifact {}", args.path.display()))?;
        print!("{}", summarize(&artifact));
    } else if args.path.exists() {
        let survey = Survey::of(&args.path);
        println!("checkpoint: {}", args.path.display());
        println!("{survey}");
        if let Ok(checkpoint) = &survey.verdict {
            println!("{}", describe(checkpoint));
        }
    } else {
        anyhow::bail!(
            "{} does not exist; inspect takes an artifact directory, a Hugging Face checkpoint \
             directory or a .gguf file",
            args.path.display()
        );
    }
    Ok(())
}

fn summarize(artifact: &Artifact) -> String {
    use std::fmt::Write as _;
    let m = artifact.manifest();
    let c = &m.model;
    let mut out = String::new();
    let _ = writeln!(out, "artifact: {}", artifact.root().display());
    let _ = writeln!(
        out,
        "format version {}, exporter {}",
        m.format_version, m.provenance.exporter
    );
    let _ = writeln!(
        out,
        "model: {} hidden {} intermediate {} layers {} heads {} (kv {}) head_dim {} vocab {}",
        c.architecture,
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size
    );
    let _ = writeln!(
        out,
        "  rope theta {} scaling {:?}, tied embeddings {}, attention bias {}",
        c.rope_theta, c.rope_scaling, c.tied_embeddings, c.attention_bias
    );
    let _ = writeln!(
        out,
        "dtype {}; KV pools {} x [{} blocks, {} tokens, {} heads, {}] {}",
        m.dtype,
        2 * m.kv_cache.num_layers,
        m.kv_cache.num_blocks,
        m.kv_cache.block_size,
        m.kv_cache.num_kv_heads,
        m.kv_cache.head_dim,
        m.kv_cache.dtype
    );
    let _ = writeln!(out, "  {}", kv_summary(&m.kv_cache));
    let _ = writeln!(
        out,
        "ladder: batch {:?}, context {:?}, prefill chunks {:?}, prefill batches {:?}",
        m.ladder.batch_buckets,
        m.ladder.context_buckets,
        m.ladder.prefill_chunks,
        m.ladder.prefill_batch_buckets
    );
    let _ = writeln!(out, "entries ({}):", m.entries.len());
    for e in &m.entries {
        let _ = writeln!(out, "  {:<28} {}", e.name, e.body);
        for v in &e.variants {
            let _ = writeln!(
                out,
                "    variant {} ({} plugins; calls {}): {}",
                v.name,
                v.platform,
                v.kernels.join(", "),
                v.body
            );
        }
    }
    let weight_bytes: u64 = m.weights.iter().map(|w| w.byte_length).sum();
    let _ = writeln!(
        out,
        "weights: {} slots, {}",
        m.weights.len(),
        human_bytes(weight_bytes)
    );
    if let Some(tp) = m.tensor_parallel {
        let split = m.weights.iter().filter(|w| w.split.is_some()).count();
        let _ = writeln!(
            out,
            "tensor parallel: {} devices ({split} weights split, one file per device; K/V pools split over KV heads)",
            tp.degree
        );
    }
    let _ = writeln!(
        out,
        "tokenizer: {}",
        m.tokenizer
            .files
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "source: {} {}",
        m.provenance.source.kind,
        m.provenance
            .source
            .files
            .iter()
            .map(|f| format!("{} (sha256 {})", f.name, f.sha256))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}

/// The K/V layout in one line: dtype, scale layout, bytes per token of context and in all.
pub fn kv_summary(kv: &tlaloc_artifact::KvCacheLayout) -> String {
    let scales = match (kv.scales, kv.scale_dims()) {
        (Some(s), Some(dims)) => format!(
            "{} scales {} {:?} beside each pool",
            s.dtype, s.granularity, dims
        ),
        _ => "no scales".to_owned(),
    };
    format!(
        "{} pools, {scales}; {} bytes per token of context, {} bytes in all",
        kv.dtype,
        kv.bytes_per_token(),
        kv.total_bytes()
    )
}
