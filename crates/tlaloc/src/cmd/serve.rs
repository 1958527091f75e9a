//! `tlaloc serve`: the OpenAI-compatible server over one artifact. The tokenizer and chat
//! template are read first (a bad one fails at once); the port opens next, and `/ready` turns
//! 200 once the plugin has compiled the entries and the weights are on the device.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tlaloc_artifact::Artifact;
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_runtime::{CompileMode, Engine, EngineOptions, LoadOptions};
use tlaloc_server::tools::ToolCallParser;
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
    /// Largest request body in bytes; past that, 413 (at once when `Content-Length` declares
    /// more).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds a client may take to send a request's headers (from connecting, or from the end
    /// of its previous response); past that, its connection is closed.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = seconds)]
    header_read_timeout: Duration,
    /// Seconds a request body may go without a byte arriving; past that, 408.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = seconds)]
    body_idle_timeout: Duration,
    /// Seconds SIGTERM waits for requests in flight before closing their connections.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = seconds)]
    shutdown_timeout: Duration,
    /// Compile each entry on first use instead of all at start.
    #[arg(long)]
    lazy_compile: bool,
    /// The most greedy decode steps run back to back on the device before their tokens are
    /// read (the engine runs fewer when a step is slow, and none while prompts wait); 1 reads
    /// every step's tokens.
    #[arg(long, default_value_t = tlaloc_runtime::DEFAULT_MAX_DECODE_CHAIN)]
    max_decode_chain: usize,
    #[command(flatten)]
    gpu: crate::cmd::generate::GpuArgs,
    #[command(flatten)]
    xla: crate::cmd::generate::XlaArgs,
    /// Which bodies run: `auto` uses an entry's body variant where this plugin supports it
    /// (the CPU kernels, say), `portable` forces the portable StableHLO bodies.
    #[arg(long, value_enum, default_value_t = crate::cmd::generate::KernelsArg::Auto)]
    kernels: crate::cmd::generate::KernelsArg,
    /// Re-hash every artifact file before loading.
    #[arg(long)]
    verify: bool,
    /// Refuse an artifact whose manifest is not signed by this public key (`tlaloc keygen`'s
    /// `.pub`); every file is then re-hashed too (as --verify), so the whole artifact is checked.
    #[arg(long, value_name = "PUBLIC_KEY_FILE")]
    require_signature: Option<PathBuf>,
    /// Prefill every prompt whole instead of reusing the K/V of a cached prefix.
    #[arg(long)]
    no_prefix_cache: bool,
    /// The most tokens one prefill step computes (its entry's prompts x chunk, padding
    /// included): several prompts are prefilled together up to it, and a running stream waits
    /// for at most one such step between its tokens.
    #[arg(long, default_value_t = tlaloc_runtime::DEFAULT_MAX_PREFILL_TOKENS, value_parser = crate::cmd::generate::token_count)]
    max_prefill_tokens: usize,
    /// How replies are read for tool calls under `tool_choice` `auto`: `hermes` (Qwen, Hermes:
    /// `<tool_call>` blocks), `llama3_json` (Llama 3.1+: bare JSON), `mistral` (`[TOOL_CALLS]`).
    /// Without it `auto` is refused; `required` and a named function are enforced either way.
    #[arg(long, value_name = "FORMAT", value_parser = parse_tool_call_parser)]
    tool_call_parser: Option<ToolCallParser>,
}

fn parse_tool_call_parser(text: &str) -> Result<ToolCallParser, String> {
    text.parse()
}

/// A positive, finite number of seconds (fractions allowed).
fn seconds(text: &str) -> Result<Duration, String> {
    let refused = || format!("`{text}` refused: a positive number of seconds, such as 10 or 0.5");
    let s: f64 = text.trim().parse().map_err(|_| refused())?;
    // NaN, infinities and negatives are refused by the conversion.
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(refused()),
    }
}

/// Runs the server until ctrl-c or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if let Some(key) = &args.require_signature {
        let id = super::sign::check_signature(&args.artifact, key)?;
        tracing::info!(key = %id, "artifact signature checked");
    }
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
        header_read_timeout: args.header_read_timeout,
        body_idle_timeout: args.body_idle_timeout,
        shutdown_timeout: args.shutdown_timeout,
        tool_call_parser: args.tool_call_parser,
    };
    let options = LoadOptions {
        plugin: PluginRequest::parse(&args.plugin),
        verify: args.verify || args.require_signature.is_some(),
        compile: if args.lazy_compile {
            CompileMode::Lazy
        } else {
            CompileMode::Eager
        },
        max_decode_chain: args.max_decode_chain,
        gpu: args.gpu.options(),
        kernels: args.kernels.choice(),
        xla_options: args.xla.options(),
        ..LoadOptions::default()
    };
    let dir = artifact.root().to_owned();
    let engine = EngineOptions {
        prefix_cache: !args.no_prefix_cache,
        max_prefill_tokens: args.max_prefill_tokens,
    };
    let load = move || Engine::load_with_options(dir, options, engine).map_err(|e| e.to_string());
    tlaloc_server::run_blocking(&args.host, args.port, AppState::new(config, text), load)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_positive_finite_seconds() {
        assert_eq!(seconds("10"), Ok(Duration::from_secs(10)));
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        for refused in ["0", "-1", "NaN", "inf", "ten", ""] {
            let e = seconds(refused).unwrap_err();
            assert!(e.contains("positive number of seconds"), "{refused}: {e}");
        }
    }
}
