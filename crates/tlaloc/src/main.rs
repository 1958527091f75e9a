//! The `tlaloc` command line: plugin management, export, inspection, generation, serving and
//! benchmarks. Each subcommand lives in its own module under `cmd/`; this file only parses
//! arguments and dispatches.

#![forbid(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};

/// Export a Hugging Face checkpoint once; serve it anywhere through a PJRT plugin.
#[derive(Debug, Parser)]
#[command(name = "tlaloc", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install, list and check PJRT plugins.
    #[command(subcommand)]
    Plugin(cmd::plugin::PluginCommand),
    /// Export a checkpoint (Hugging Face directory or .gguf) into an artifact directory.
    Export(cmd::export::ExportArgs),
    /// Summarize an artifact directory or describe a checkpoint.
    Inspect(cmd::inspect::InspectArgs),
    /// Re-hash an artifact's files against its manifest (and check its signature).
    Verify(cmd::verify::VerifyArgs),
    /// Compile every entry with a plugin and ship the executables in the artifact.
    Compile(cmd::compile::CompileArgs),
    /// Make an ed25519 key pair for signing artifacts.
    Keygen(cmd::sign::KeygenArgs),
    /// Sign an artifact's manifest (which hashes every file) with a secret key.
    Sign(cmd::sign::SignArgs),
    /// Generate from one prompt, streaming text or printing one JSON object.
    Generate(cmd::generate::GenerateArgs),
    /// Measure start-up, prefill and decode speed against the bytes-per-step floor.
    Bench(cmd::bench::BenchArgs),
    /// Serve an artifact over the OpenAI HTTP API.
    Serve(cmd::serve::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Plugin(command) => cmd::plugin::run(command),
        Command::Export(args) => cmd::export::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Verify(args) => cmd::verify::run(args),
        Command::Compile(args) => cmd::compile::run(args),
        Command::Keygen(args) => cmd::sign::keygen(args),
        Command::Sign(args) => cmd::sign::sign(args),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Serve(args) => cmd::serve::run(args),
    }
}
