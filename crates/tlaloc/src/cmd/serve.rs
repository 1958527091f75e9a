//! `tlaloc serve`: the OpenAI-compatible server over one artifact. The tokenizer and chat
//! template are read first (a bad one fails at once); the port opens next, and `/ready` turns
//! 200 once the plugin has compiled the entries and the weights are on the device.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tlaloc_artifact::Artifact;
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_runtime::{CompileMode, Engine, LoadOptions};
use tlaloc_server::{AppState, ModelText, ServerConfig};

/// Arguments of `tlaloc serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The artifact directory (made by `tlaloc export`).
    #[arg(long)]
    artifact: PathBuf,
    /// `auto`, `cpu`, `cuda`, `rocm`, `tpu`, or the path of a plugin `.so`.
    #[arg(long, default_value = "auto")]
    plugin: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one, printed in the log).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` on the API routes.
    #[arg(long)]
    api_key: Option<String>,
    /// Sequences that may wait beyond what the engine runs at once; past that, 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// The model name clients send (default: the artifact directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Largest request body in bytes; past that, 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Compile each entry on first use instead of all at start.
    #[arg(long)]
    lazy_compile: bool,
    /// The most greedy decode steps run back to back on the device before their tokens are
    /// read (the engine runs fewer when a step is slow, and none while prompts wait); 1 reads
    /// every step's tokens.
    #[arg(long, default_value_t = tlaloc_runtime::DEFAULT_MAX_DECODE_CHAIN)]
    max_decode_chain: usize,
    /// Re-hash every artifact file before loading.
    #[arg(long)]
    verify: bool,
}

/// Runs the server until ctrl-c or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let artifact = Artifact::open(&args.artifact)
        .with_context(|| format!("cannot open the artifact {}", args.artifact.display()))?;
    let text = ModelText::from_artifact(&artifact)?;
    let name = match args.served_model_name {
        Some(n) => n,
        None => artifact
            .root()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_owned()),
    };
    let config = ServerConfig {
        served_model_name: name,
        api_key: args.api_key,
        max_queue: args.max_queue,
        max_body_bytes: args.max_body_bytes,
    };
    let options = LoadOptions {
        plugin: PluginRequest::parse(&args.plugin),
        verify: args.verify,
        compile: if args.lazy_compile {
            CompileMode::Lazy
        } else {
            CompileMode::Eager
        },
        max_decode_chain: args.max_decode_chain,
        ..LoadOptions::default()
    };
    let dir = artifact.root().to_owned();
    let load = move || Engine::load(dir, options).map_err(|e| e.to_string());
    tlaloc_server::run_blocking(&args.host, args.port, AppState::new(config, text), load)?;
    Ok(())
}
