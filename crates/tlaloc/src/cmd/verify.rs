//! `tlaloc verify DIR`: re-hash every body, weight and tokenizer file of an artifact against
//! its manifest; any mismatch is reported naming the file and the command exits non-zero.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tlaloc_artifact::Artifact;

use super::export::human_bytes;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The artifact directory.
    dir: PathBuf,
}

pub fn run(args: VerifyArgs) -> Result<()> {
    let start = Instant::now();
    let artifact = Artifact::open(&args.dir)
        .with_context(|| format!("opening artifact {}", args.dir.display()))?;
    let report = artifact
        .verify()
        .with_context(|| format!("verifying {}", args.dir.display()))?;
    println!(
        "ok: {} files, {} re-hashed in {:.2?}",
        report.files,
        human_bytes(report.bytes),
        start.elapsed()
    );
    Ok(())
}
