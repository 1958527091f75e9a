//! `tlaloc verify DIR`: re-hash every body, weight, tokenizer and executable file of an
//! artifact against its manifest; any mismatch is reported naming the file and the command
//! exits non-zero. With `--public-key`, the manifest's signature is checked too, so a pass
//! covers the whole artifact.

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
    /// Also require a good signature of the manifest by this key (`tlaloc keygen`'s `.pub`).
    #[arg(long, value_name = "FILE")]
    public_key: Option<PathBuf>,
}

pub fn run(args: VerifyArgs) -> Result<()> {
    let start = Instant::now();
    let signed_by = match &args.public_key {
        Some(key) => Some(super::sign::check_signature(&args.dir, key)?),
        None => None,
    };
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
    if let Some(id) = signed_by {
        println!("ok: the manifest is signed by key {id}");
    }
    Ok(())
}
