//! The `tlaloc` command line: plugin management, export, inspection, generation, serving and
//! benchmarks. Each subcommand lives in its own module under `cmd/`; this file only parses
//! arguments and dispatches.

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
        Command::Serve(args) => cmd::serve::run(args),
    }
}
