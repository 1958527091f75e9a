//! What every handler shares: the configuration, the model's text side (tokenizer and chat
//! template, ready before the engine), the engine once it has loaded, the admission count that
//! bounds the queue, and the metrics.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tlaloc_artifact::Artifact;
use tlaloc_runtime::EngineHandle;

use crate::chat::{ChatTemplate, ChatTemplateError};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::structured::Grammars;
use crate::text::{TextCodec, TextError};
use crate::tools::ToolCallParser;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients send as `model`.
    pub served_model_name: String,
    /// Required as `Authorization: Bearer <key>` on `/v1/*`, `/tokenize`, `/detokenize`.
    pub api_key: Option<String>,
    /// Sequences that may wait beyond those the engine runs at once; past that, 429.
    pub max_queue: usize,
    /// Largest request body, in bytes; past that, 413 (at once when `Content-Length` declares
    /// more).
    pub max_body_bytes: usize,
    /// The longest a client may take to send a request's headers, counted from the connection
    /// opening or from the end of its previous response; past that, the connection is closed.
    pub header_read_timeout: Duration,
    /// The longest a request body may go without a byte arriving; past that, 408.
    pub body_idle_timeout: Duration,
    /// The longest shutdown waits for requests in flight before closing their connections.
    pub shutdown_timeout: Duration,
    /// The format tool calls are read in under `tool_choice` `auto` (`None` refuses `auto`).
    pub tool_call_parser: Option<ToolCallParser>,
}

impl ServerConfig {
    /// Defaults for a model name.
    pub fn new(served_model_name: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            api_key: None,
            max_queue: 256,
            max_body_bytes: 4 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            tool_call_parser: None,
        }
    }
}

/// Seconds since the Unix epoch, now (0 on a clock set before 1970).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The text side of the model could not be loaded from the artifact.
#[derive(Debug, Error)]
pub enum ModelTextError {
    /// The artifact lists no such tokenizer file.
    #[error("the artifact has no tokenizer file `{0}`; re-export it with its tokenizer")]
    Missing(&'static str),
    /// A tokenizer file could not be read or parsed.
    #[error("cannot read the artifact's {file}: {message}")]
    Read { file: String, message: String },
    /// The tokenizer did not load.
    #[error(transparent)]
    Tokenizer(#[from] TextError),
    /// The chat template does not parse.
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
}

/// The tokenizer and, when the model has one, its chat template.
#[derive(Debug)]
pub struct ModelText {
    /// The tokenizer.
    pub codec: TextCodec,
    /// The chat template; `None` refuses chat requests by name.
    pub chat: Option<ChatTemplate>,
    /// The `tokenizer.json` it was read from (structured outputs read its vocabulary).
    pub tokenizer_json: std::path::PathBuf,
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn special_token(config: &serde_json::Value, key: &str) -> String {
    match config.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_owned(),
        None => String::new(),
    }
}

impl ModelText {
    /// Loads the tokenizer and chat template the artifact carries. The template is
    /// `chat_template.jinja` when present, else `chat_template` in `tokenizer_config.json` (a
    /// string, or a list of named templates of which `default` is used).
    pub fn from_artifact(artifact: &Artifact) -> Result<Self, ModelTextError> {
        let file = |name: &str| {
            artifact
                .manifest()
                .tokenizer
                .files
                .iter()
                .find(|f| f.name == name)
                .map(|f| artifact.root().join(&f.path))
        };
        let tokenizer = file("tokenizer.json").ok_or(ModelTextError::Missing("tokenizer.json"))?;
        let config = match file("tokenizer_config.json") {
            Some(p) => read_json(&p)?,
            None => serde_json::Value::Null,
        };
        let template = match file("chat_template.jinja") {
            Some(p) => Some(
                std::fs::read_to_string(&p).map_err(|e| ModelTextError::Read {
                    file: p.display().to_string(),
                    message: e.to_string(),
                })?,
            ),
            None => template_from_config(&config),
        };
        Self::new(
            &tokenizer,
            template,
            special_token(&config, "bos_token"),
            special_token(&config, "eos_token"),
        )
    }

    /// From a `tokenizer.json` and an optional template.
    pub fn new(
        tokenizer: &Path,
        template: Option<String>,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, ModelTextError> {
        let codec = TextCodec::from_file(tokenizer)?;
        let chat = template
            .map(|t| ChatTemplate::new(t, bos_token, eos_token))
            .transpose()?;
        Ok(Self {
            codec,
            chat,
            tokenizer_json: tokenizer.to_owned(),
        })
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, ModelTextError> {
    let read = |message: String| ModelTextError::Read {
        file: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| read(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| read(e.to_string()))
}

fn template_from_config(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// Shared by every handler.
#[derive(Debug)]
pub struct AppState {
    /// Configuration.
    pub config: ServerConfig,
    /// Tokenizer and template.
    pub text: ModelText,
    engine: OnceLock<EngineHandle>,
    admitted: AtomicUsize,
    stopping: AtomicBool,
    next_id: AtomicU64,
    /// Unix seconds at start: the `created` of the served model in `/v1/models` (a model's
    /// `created` is when it came to be, not when it is listed), and part of every response id,
    /// so that ids stay unique across restarts.
    pub started_at: u64,
    /// Metrics.
    pub metrics: Metrics,
    /// Compiled grammars of structured outputs.
    pub grammars: Grammars,
}

/// The state as handlers hold it.
pub type SharedState = Arc<AppState>;

/// Sequences admitted and not yet ended; dropping it gives their places back.
#[derive(Debug)]
pub struct Admission {
    state: SharedState,
    count: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.admitted.fetch_sub(self.count, Ordering::AcqRel);
    }
}

impl AppState {
    /// State with no engine yet (`/ready` answers 503 until [`AppState::set_engine`]).
    pub fn new(config: ServerConfig, text: ModelText) -> SharedState {
        let grammars = Grammars::new(text.tokenizer_json.clone());
        Arc::new(AppState {
            config,
            text,
            grammars,
            engine: OnceLock::new(),
            admitted: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            started_at: unix_now(),
            metrics: Metrics::new(),
        })
    }

    /// Makes the loaded engine available; the server is ready from now on.
    pub fn set_engine(&self, engine: EngineHandle) {
        if self.engine.set(engine).is_err() {
            tracing::warn!("an engine was already set; keeping the first");
        }
    }

    /// The engine, when loaded.
    pub fn engine(&self) -> Option<&EngineHandle> {
        self.engine.get()
    }

    /// The engine, or 503 while loading or stopping.
    pub fn ready_engine(&self) -> Result<&EngineHandle, ApiError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(ApiError::not_ready("the server is shutting down"));
        }
        self.engine.get().ok_or_else(|| {
            ApiError::not_ready("the model is still loading; retry when /ready answers 200")
        })
    }

    /// Marks the server as stopping (`/ready` then answers 503).
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether the model is loaded and the server not stopping.
    pub fn is_ready(&self) -> bool {
        self.ready_engine().is_ok()
    }

    /// A new response id.
    pub fn next_request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started_at)
    }

    /// Sequences the server holds at most: what the engine runs at once, plus the queue.
    pub fn capacity(&self, engine: &EngineHandle) -> usize {
        engine.shape().ladder.max_decode_batch() + self.config.max_queue
    }

    /// Takes places for `count` sequences, or refuses with 429.
    pub fn admit(
        self: &Arc<Self>,
        engine: &EngineHandle,
        count: usize,
    ) -> Result<Admission, ApiError> {
        let capacity = self.capacity(engine);
        self.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + count <= capacity).then_some(held + count)
            })
            .map_err(|_| ApiError::queue_full(capacity))?;
        Ok(Admission {
            state: Arc::clone(self),
            count,
        })
    }
}
