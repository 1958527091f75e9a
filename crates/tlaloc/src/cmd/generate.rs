//! `tlaloc generate`: one prompt through the engine. The prompt is text (tokenized with the
//! artifact's `tokenizer.json`, optionally rendered through its chat template first) or ids; the
//! output streams to stdout as stable text pieces, or comes as one JSON object with the ids, the
//! text, why it stopped and where the time went.
//!
//! Also owns what `bench` shares with it: the plugin and compile-cache arguments and the
//! load-time report.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tlaloc_artifact::Artifact;
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::{GpuAllocator, GpuOptions, XlaOptionValue};
use tlaloc_runtime::{
    CompileMode, DEFAULT_MAX_DECODE_CHAIN, DEFAULT_MAX_PREFILL_TOKENS, Engine, EngineHandle,
    EngineOptions, GenerateRequest, KernelChoice, LoadOptions, LoadTimings, SamplingParams,
    StepTimings, StopParams, TokenEvent,
};
use tlaloc_server::ModelText;
use tlaloc_server::chat::TemplateMessage;
use tlaloc_server::text::IncrementalDecoder;

/// How to load the engine: plugin, compile cache, compile mode.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The artifact directory (made by `tlaloc export`).
    #[arg(long)]
    pub artifact: PathBuf,
    /// `auto`, `cpu`, `cuda`, `rocm`, `tpu`, or the path of a plugin `.so`.
    #[arg(long, default_value = "auto")]
    pub plugin: String,
    /// Where compiled entries are kept between runs (default: the project's compile cache).
    #[arg(long, conflicts_with = "no_compile_cache")]
    pub compile_cache: Option<PathBuf>,
    /// Compile every entry from its text, reading and writing no cache.
    #[arg(long)]
    pub no_compile_cache: bool,
    /// Re-hash every artifact file before loading.
    #[arg(long)]
    pub verify: bool,
    /// Compile every entry even when the artifact ships executables for this plugin.
    #[arg(long)]
    pub no_artifact_executables: bool,
    /// The most greedy decode steps run back to back on the device before their tokens are
    /// read (the engine runs fewer when a step is slow); 1 reads every step's tokens.
    #[arg(long, default_value_t = DEFAULT_MAX_DECODE_CHAIN)]
    pub max_decode_chain: usize,
    /// Prefill every prompt whole instead of reusing the K/V of a cached prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// The most tokens one prefill step computes (its entry's prompts x chunk, padding
    /// included): several prompts are prefilled together up to it, and a running stream waits
    /// for at most one such step between its tokens.
    #[arg(long, default_value_t = DEFAULT_MAX_PREFILL_TOKENS, value_parser = token_count)]
    pub max_prefill_tokens: usize,
    /// Which bodies run: `auto` uses an entry's body variant where this plugin supports it
    /// (the CPU kernels, say), `portable` forces the portable StableHLO bodies.
    #[arg(long, value_enum, default_value_t = KernelsArg::Auto)]
    pub kernels: KernelsArg,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub xla: XlaArgs,
}

/// The `--kernels` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelsArg {
    /// A body variant where the plugin supports it, else the portable body.
    Auto,
    /// Always the portable body.
    Portable,
}

impl KernelsArg {
    pub fn choice(self) -> KernelChoice {
        match self {
            KernelsArg::Auto => KernelChoice::Auto,
            KernelsArg::Portable => KernelChoice::Portable,
        }
    }
}

/// Device memory options of GPU plugins (ignored by CPU plugins).
#[derive(Debug, Args)]
pub struct GpuArgs {
    /// The fraction of the GPU's memory the allocator may use, in (0, 1] (plugin default: 0.75).
    #[arg(long, value_parser = memory_fraction)]
    pub gpu_memory_fraction: Option<f32>,
    /// Reserve the memory fraction in one allocation when the client starts, instead of growing
    /// the allocator as weights and pools arrive (the process holds the whole fraction from the
    /// start; on the H200 this made start-up slower, not faster: docs/benchmarks.md).
    #[arg(long)]
    pub gpu_preallocate: bool,
    /// The GPU plugin's device allocator (plugin default: bfc).
    #[arg(long, value_enum)]
    pub gpu_allocator: Option<GpuAllocatorArg>,
}

/// XLA compiler options for every entry compiled (any plugin).
#[derive(Debug, Args)]
pub struct XlaArgs {
    /// An XLA compiler option (a field of `xla.DebugOptions`) for every entry this run
    /// compiles, as NAME=VALUE, repeatable; e.g. `--xla-option xla_gpu_enable_command_buffer=`.
    /// `true`/`false` are booleans, whole numbers integers, anything else a string. Unlike
    /// `XLA_FLAGS` they are part of the compile-cache key and of the identity shipped
    /// executables are matched by; a name the plugin does not know fails the compile.
    #[arg(long = "xla-option", value_name = "NAME=VALUE", value_parser = xla_option)]
    pub xla_options: Vec<(String, XlaOptionValue)>,
}

impl XlaArgs {
    /// The options by name (the last of a repeated name wins, as on a command line).
    pub fn options(&self) -> BTreeMap<String, XlaOptionValue> {
        self.xla_options.iter().cloned().collect()
    }
}

/// `NAME=VALUE` with a non-empty name of letters, digits and underscores.
fn xla_option(text: &str) -> Result<(String, XlaOptionValue), String> {
    let refused = || {
        format!(
            "`{text}` refused: an XLA option as NAME=VALUE, NAME a field of xla.DebugOptions \
             (letters, digits, `_`), e.g. xla_gpu_enable_command_buffer="
        )
    };
    let (name, value) = text.split_once('=').ok_or_else(refused)?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(refused());
    }
    Ok((name.to_string(), XlaOptionValue::parse(value)))
}

/// The `--gpu-allocator` choices, by the plugin's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuAllocatorArg {
    /// XLA's best-fit-with-coalescing pool allocator.
    Bfc,
    /// CUDA's stream-ordered allocator (`cudaMallocAsync`).
    CudaAsync,
    /// The platform's allocator, one device allocation per buffer.
    Platform,
}

impl GpuArgs {
    /// The client's GPU create options these arguments ask for.
    pub fn options(&self) -> GpuOptions {
        GpuOptions {
            preallocate: self.gpu_preallocate,
            memory_fraction: self.gpu_memory_fraction,
            allocator: self.gpu_allocator.map(|a| match a {
                GpuAllocatorArg::Bfc => GpuAllocator::Bfc,
                GpuAllocatorArg::CudaAsync => GpuAllocator::CudaAsync,
                GpuAllocatorArg::Platform => GpuAllocator::Platform,
            }),
        }
    }
}

/// A fraction of device memory: a number in (0, 1].
fn memory_fraction(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "`{text}` refused: a fraction of the device's memory, greater than 0 and at most 1"
        )),
    }
}

/// A count of tokens: a whole number, at least 1.
pub fn token_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "`{text}` refused: a whole number of tokens, at least 1"
        )),
    }
}

impl EngineArgs {
    /// The load options these arguments ask for, with `compile` as the compile mode.
    pub fn load_options(&self, compile: CompileMode) -> LoadOptions {
        let defaults = LoadOptions::default();
        LoadOptions {
            plugin: PluginRequest::parse(&self.plugin),
            verify: self.verify,
            compile,
            compile_cache: if self.no_compile_cache {
                None
            } else {
                self.compile_cache.clone().or(defaults.compile_cache)
            },
            max_decode_chain: self.max_decode_chain,
            artifact_executables: !self.no_artifact_executables,
            gpu: self.gpu.options(),
            kernels: self.kernels.choice(),
            xla_options: self.xla.options(),
            ..defaults
        }
    }

    /// Starts the engine over the artifact.
    pub fn start(&self, compile: CompileMode) -> Result<EngineHandle> {
        let engine = EngineOptions {
            prefix_cache: !self.no_prefix_cache,
            max_prefill_tokens: self.max_prefill_tokens,
        };
        Engine::load_with_options(self.artifact.clone(), self.load_options(compile), engine)
            .with_context(|| format!("cannot load {} onto a device", self.artifact.display()))
    }
}

/// Arguments of `tlaloc generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The prompt as text (tokenized with the artifact's tokenizer).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids, e.g. `1,2,3`.
    #[arg(long)]
    prompt_ids: Option<String>,
    /// Render the prompt as one user message through the model's chat template.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Generated tokens at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (1 keeps all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Drop tokens under this fraction of the most likely one's probability.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Seed of the sampler (the same seed gives the same tokens).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep going past the model's end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Compile every entry at start instead of each on first use.
    #[arg(long)]
    eager_compile: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Parses `1,2,3`; refuses an empty list or a part that is not a token id, naming it.
pub fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let ids = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
        .map(|(i, p)| {
            p.parse::<u32>().with_context(|| {
                format!("--prompt-ids part {i} ({p:?}) refused: expected a token id (0..2^32)")
            })
        })
        .collect::<Result<Vec<u32>>>()?;
    if ids.is_empty() {
        bail!("--prompt-ids {text:?} refused: give at least one comma-separated token id");
    }
    Ok(ids)
}

/// The tokenizer and chat template, when the artifact carries a `tokenizer.json`.
fn model_text(artifact: &Artifact) -> Result<Option<ModelText>> {
    let has_tokenizer = artifact
        .manifest()
        .tokenizer
        .files
        .iter()
        .any(|f| f.name == "tokenizer.json");
    if !has_tokenizer {
        return Ok(None);
    }
    Ok(Some(ModelText::from_artifact(artifact)?))
}

fn prompt_ids(args: &GenerateArgs, text: Option<&ModelText>) -> Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_ids {
        return parse_ids(ids);
    }
    let prompt = args.prompt.as_deref().unwrap_or_default();
    let Some(text) = text else {
        bail!(
            "--prompt refused: the artifact {} carries no tokenizer.json; pass --prompt-ids",
            args.engine.artifact.display()
        );
    };
    if args.chat {
        let Some(chat) = &text.chat else {
            bail!(
                "--chat refused: the artifact {} has no chat template; drop --chat",
                args.engine.artifact.display()
            );
        };
        let rendered = chat.render(
            &[TemplateMessage {
                role: "user".into(),
                content: prompt.to_owned(),
                ..Default::default()
            }],
            None,
            true,
        )?;
        // The template writes the special tokens itself, as transformers' apply_chat_template.
        Ok(text.codec.encode(&rendered, false)?)
    } else {
        Ok(text.codec.encode(prompt, true)?)
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Start-up time as JSON, with whether the compile cache served the entries.
pub fn load_json(timings: Option<&LoadTimings>, cache_enabled: bool) -> Value {
    let Some(t) = timings else {
        return Value::Null;
    };
    json!({
        "total_ms": ms(t.total),
        "open_ms": ms(t.open),
        "client_ms": ms(t.client),
        "compile_ms": ms(t.compile),
        "upload_weights_ms": ms(t.upload_weights),
        "upload_read_thread_ms": ms(t.upload_read),
        "upload_transfer_thread_ms": ms(t.upload_transfer),
        "upload_pinned_bytes": t.upload_pinned_bytes,
        "allocate_pools_ms": ms(t.allocate_pools),
        "compiled": t.compiled,
        "cache_hits": t.cache_hits,
        "from_artifact": t.from_artifact,
        "executables": t.executables,
        "bodies": t.bodies,
        "deferred": t.deferred,
        "compile_cache": cache_state(t, cache_enabled),
    })
}

/// `warm` when the cache served every entry compiled at start, `cold` when it served none.
pub fn cache_state(t: &LoadTimings, cache_enabled: bool) -> &'static str {
    match (cache_enabled, t.compiled, t.cache_hits) {
        (false, _, _) => "disabled",
        (true, 0, 0) => "unused (lazy compile)",
        (true, 0, _) => "warm",
        (true, _, 0) => "cold",
        (true, _, _) => "partly warm",
    }
}

/// Per-phase split of `total` over `steps` steps, in milliseconds per step.
pub fn split_json(total: StepTimings, steps: u64) -> Value {
    let per = |d: Duration| {
        if steps == 0 {
            0.0
        } else {
            ms(d) / steps as f64
        }
    };
    json!({
        "build_ms": per(total.build),
        "upload_ms": per(total.upload),
        "execute_ms": per(total.execute),
        "readback_ms": per(total.readback),
        "other_ms": per(total.other),
        "total_ms": per(total.total()),
    })
}

/// Runs `tlaloc generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let started = Instant::now();
    let artifact = Artifact::open(&args.engine.artifact).with_context(|| {
        format!(
            "cannot open the artifact {}",
            args.engine.artifact.display()
        )
    })?;
    let text = model_text(&artifact)?;
    let prompt_ids = prompt_ids(&args, text.as_ref())?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplingParams::greedy()
    };
    sampling.validate()?;
    let request = GenerateRequest {
        prompt_ids: prompt_ids.clone(),
        sampling,
        stop: StopParams::default(),
        max_tokens: Some(args.max_new_tokens),
        logprobs: None,
        ignore_eos: args.ignore_eos,
        sequence: None,
        constraint: None,
    };

    let compile = if args.eager_compile {
        CompileMode::Eager
    } else {
        CompileMode::Lazy
    };
    let engine = args.engine.start(compile)?;
    let ready = started.elapsed();
    let outcome = stream(&engine, request, text.as_ref(), !args.json);
    let stats = engine.stats();
    engine.shutdown();
    let (generated, finish, text_out, timings) = outcome?;

    let steps = stats.steps;
    let prefill = steps.prefill_time.total();
    let decode = steps.decode_time.total();
    let decode_ms_per_step = if steps.decode_steps == 0 {
        0.0
    } else {
        ms(decode) / steps.decode_steps as f64
    };
    let tokens_per_s = if decode.is_zero() {
        0.0
    } else {
        steps.decode_rows as f64 / decode.as_secs_f64()
    };
    let platform = engine.platform().map(|p| {
        json!({
            "plugin": p.plugin_path.display().to_string(),
            "device_kind": p.identity.device_kind,
            "platform": p.identity.platform_name,
        })
    });
    let report = json!({
        "prompt_ids": prompt_ids,
        "generated_ids": generated,
        "text": text_out,
        "finish_reason": finish.as_str(),
        "platform": platform,
        "timings": {
            "ready_ms": ms(ready),
            "load": load_json(engine.load_timings(), !args.engine.no_compile_cache),
            // Lazily compiled entries compile inside the first step that uses them (its `other`).
            "compile_mode": if args.eager_compile { "eager" } else { "lazy" },
            "time_to_first_token_ms": timings.time_to_first_token.map(ms),
            "request_total_ms": ms(timings.total),
            "prefill_ms": ms(prefill),
            "prefill_steps": steps.prefill_steps,
            "prefill_tokens": steps.prefill_tokens,
            "prefill_split_per_step": split_json(steps.prefill_time, steps.prefill_steps),
            "decode_steps": steps.decode_steps,
            "decode_ms_per_step": decode_ms_per_step,
            "decode_split_per_step": split_json(steps.decode_time, steps.decode_steps),
            "tokens_per_s": tokens_per_s,
        },
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "[{} tokens, finish {}, prefill {:.1} ms, decode {:.2} ms/step ({:.1} tokens/s), ready in {:.0} ms]",
            report["generated_ids"].as_array().map_or(0, Vec::len),
            finish.as_str(),
            ms(prefill),
            decode_ms_per_step,
            tokens_per_s,
            ms(ready),
        );
    }
    Ok(())
}

type Streamed = (
    Vec<u32>,
    tlaloc_runtime::FinishReason,
    Option<String>,
    tlaloc_runtime::RequestTimings,
);

/// Submits the request and collects its tokens; with `echo`, writes each stable text piece (or
/// each id, without a tokenizer) to stdout as it comes.
fn stream(
    engine: &EngineHandle,
    request: GenerateRequest,
    text: Option<&ModelText>,
    echo: bool,
) -> Result<Streamed> {
    let (_, mut events) = engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    let mut decoder = IncrementalDecoder::default();
    let mut ids = Vec::new();
    let mut out = String::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            TokenEvent::Token { id, .. } => {
                ids.push(id);
                let piece = match text {
                    Some(t) => decoder.push(&t.codec, id)?,
                    None if echo => format!("{id} "),
                    None => String::new(),
                };
                out.push_str(&piece);
                if echo && !piece.is_empty() {
                    stdout.write_all(piece.as_bytes())?;
                    stdout.flush()?;
                }
            }
            TokenEvent::Finished {
                reason, timings, ..
            } => {
                let tail = match text {
                    Some(t) => decoder.flush(&t.codec)?,
                    None => String::new(),
                };
                out.push_str(&tail);
                if echo {
                    writeln!(stdout, "{tail}")?;
                }
                return Ok((ids, reason, text.map(|_| out), timings));
            }
            TokenEvent::Error { message } => bail!("generation failed: {message}"),
        }
    }
    bail!("the engine stopped before the request finished")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_fraction_outside_zero_to_one_is_refused_by_name() {
        assert_eq!(memory_fraction("0.45"), Ok(0.45));
        assert_eq!(memory_fraction("1"), Ok(1.0));
        for bad in ["0", "-0.2", "1.5", "half", "NaN"] {
            let refusal = memory_fraction(bad).unwrap_err();
            assert!(refusal.contains(bad), "{refusal}");
            assert!(refusal.contains("at most 1"), "{refusal}");
        }
    }

    #[test]
    fn gpu_arguments_become_the_clients_create_options() {
        let args = GpuArgs {
            gpu_memory_fraction: Some(0.5),
            gpu_preallocate: true,
            gpu_allocator: Some(GpuAllocatorArg::CudaAsync),
        };
        assert_eq!(
            args.options(),
            GpuOptions {
                preallocate: true,
                memory_fraction: Some(0.5),
                allocator: Some(GpuAllocator::CudaAsync),
            }
        );
    }

    #[test]
    fn xla_options_parse_typed_values_and_refuse_what_is_not_name_equals_value() {
        let parsed: Vec<(String, XlaOptionValue)> = [
            "xla_gpu_enable_command_buffer=",
            "xla_cpu_use_thunk_runtime=false",
            "xla_gpu_autotune_level=0",
            "xla_dump_to=/x=y",
        ]
        .iter()
        .map(|text| xla_option(text).unwrap())
        .collect();
        assert_eq!(
            parsed,
            [
                (
                    "xla_gpu_enable_command_buffer".to_string(),
                    XlaOptionValue::String(String::new())
                ),
                (
                    "xla_cpu_use_thunk_runtime".to_string(),
                    XlaOptionValue::Bool(false)
                ),
                ("xla_gpu_autotune_level".to_string(), XlaOptionValue::Int(0)),
                (
                    "xla_dump_to".to_string(),
                    XlaOptionValue::String("/x=y".into())
                ),
            ]
        );
        for bad in ["xla_dump_to", "=1", "--xla_dump_to=x", "a b=1"] {
            let err = xla_option(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}` refused")), "{err}");
        }
    }
}
