//! `tlaloc compile ARTIFACT --plugin P`: compile every entry with one plugin and ship the
//! serialized executables in the artifact, listed under the identity of what compiled them, so
//! a machine with the same plugin build and device kind starts without compiling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use tlaloc_pjrt::XlaOptionValue;
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_runtime::{LoadOptions, compile_into_artifact};

use super::export::human_bytes;

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The artifact directory.
    artifact: PathBuf,
    /// `auto`, `cpu`, `cuda`, `rocm`, `tpu`, or the path of a plugin `.so`.
    #[arg(long, default_value = "auto")]
    plugin: String,
    /// Where compiled entries are kept between runs (default: the project's compile cache).
    #[arg(long, conflicts_with = "no_compile_cache")]
    compile_cache: Option<PathBuf>,
    /// Compile every entry from its text, reading and writing no cache.
    #[arg(long)]
    no_compile_cache: bool,
    #[command(flatten)]
    xla: super::generate::XlaArgs,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let cache = if args.no_compile_cache {
        None
    } else {
        args.compile_cache
            .clone()
            .or(LoadOptions::default().compile_cache)
    };
    compile_for(&args.artifact, &args.plugin, cache, args.xla.options())
}

/// Compiles the artifact in `dir` with `plugin` and prints what was added (shared with
/// `export --compile`).
pub fn compile_for(
    dir: &Path,
    plugin: &str,
    compile_cache: Option<PathBuf>,
    xla_options: BTreeMap<String, XlaOptionValue>,
) -> Result<()> {
    let options = LoadOptions {
        plugin: PluginRequest::parse(plugin),
        compile_cache,
        xla_options,
        // Every file is hashed before its executable is shipped beside it.
        verify: true,
        ..LoadOptions::default()
    };
    let report = compile_into_artifact(dir, &options)
        .with_context(|| format!("compiling {} with plugin {plugin}", dir.display()))?;
    println!(
        "compiled {} entries ({} now, {} from the compile cache) in {:.2?}: {} executables, {}, for {}{}",
        report.entries,
        report.compiled,
        report.cache_hits,
        report.compile_time,
        report.files,
        human_bytes(report.bytes),
        report.identity.describe(),
        if report.replaced {
            " (replacing the earlier ones of this identity)"
        } else {
            ""
        }
    );
    if report.removed_signature {
        println!(
            "removed the old signature {}: the manifest changed; sign the artifact again",
            tlaloc_artifact::signature::SIGNATURE_FILE
        );
    }
    Ok(())
}
