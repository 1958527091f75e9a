//! One model's state: its engine, its tokenizer, its live sequences, its gauges, and the
//! responder runtime that answers every request from the engine's side.
//!
//! `execute` never waits on the device: it reads each request's inputs, makes its response
//! factory, releases the request, submits to the engine and hands the event stream to a task
//! on the responder runtime, which sends the responses, watches for cancellation and keeps the
//! sequence table. A reaper task frees the pages of sequences idle past the configured
//! `max_sequence_idle_microseconds` (Triton's own idle timeout does not tell the backend).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_runtime::{
    Engine, EngineHandle, EngineOptions, FinishReason, GenerateRequest, LoadOptions, RequestId,
    SequenceControl, TokenEvent,
};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;

use crate::config::{BackendConfig, Mode, SequenceControls};
use crate::error::{BackendError, Code};
use crate::ffi::{self, Gauge, GaugeFamily, OutputTensor, Request, ResponseFactory, TensorData};
use crate::params::{self, Sampling};
use crate::text::{Codec, IncrementalText};

/// How often a running request checks whether its client went away.
const CANCEL_POLL: Duration = Duration::from_millis(20);
/// How often the gauges are refreshed.
const GAUGE_PERIOD: Duration = Duration::from_millis(50);

/// Refuses a server whose TRITONBACKEND API is not the one declared in [`ffi`].
pub fn check_api_version(major: u32, minor: u32) -> Result<(), BackendError> {
    if major != ffi::API_VERSION_MAJOR || minor < ffi::API_VERSION_MINOR {
        return Err(BackendError::new(
            Code::Unsupported,
            format!(
                "TRITONBACKEND API {major}.{minor} refused; the tlaloc backend is built for {}.{} (a server with major {} and minor {} or later)",
                ffi::API_VERSION_MAJOR,
                ffi::API_VERSION_MINOR,
                ffi::API_VERSION_MAJOR,
                ffi::API_VERSION_MINOR
            ),
        ));
    }
    Ok(())
}

struct Families {
    used: GaugeFamily,
    total: GaugeFamily,
    sequences: GaugeFamily,
}

/// The gauge families, made once per process (a family is per name, across models).
static FAMILIES: OnceLock<Option<Families>> = OnceLock::new();

fn families() -> Option<&'static Families> {
    FAMILIES
        .get_or_init(|| {
            let made = (|| {
                Ok::<_, BackendError>(Families {
                    used: GaugeFamily::new(
                        "tlaloc_kv_pages_used",
                        "K/V pages held by running and parked sequences",
                    )?,
                    total: GaugeFamily::new("tlaloc_kv_pages_total", "K/V pages in the pool")?,
                    sequences: GaugeFamily::new(
                        "tlaloc_sequences_live",
                        "Sequences started and not yet ended or reaped (sequence mode)",
                    )?,
                })
            })();
            match made {
                Ok(f) => Some(f),
                Err(e) => {
                    ffi::log(
                        ffi::LOG_WARN,
                        &format!(
                            "metrics off ({}); the tlaloc gauges are not exported",
                            e.message
                        ),
                    );
                    None
                }
            }
        })
        .as_ref()
}

#[derive(Debug)]
struct Gauges {
    used: Gauge,
    total: Gauge,
    sequences: Gauge,
}

/// A sequence the backend knows: started, not yet ended or reaped.
#[derive(Debug, Clone, Copy)]
struct LiveSequence {
    /// Tokens it holds (prompts and outputs so far).
    tokens: usize,
    /// When its last request finished (or started, while busy).
    last_active: Instant,
    /// A request for it is running.
    busy: bool,
}

#[derive(Debug)]
struct Shared {
    config: BackendConfig,
    engine: EngineHandle,
    codec: Codec,
    sequences: Mutex<HashMap<u64, LiveSequence>>,
    gauges: Option<Gauges>,
}

/// The state of one loaded model.
#[derive(Debug)]
pub struct ModelState {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Runtime,
}

impl ModelState {
    /// Reads the configuration, refuses what cannot be served, loads the engine.
    pub fn initialize(model: ffi::Model) -> Result<Self, BackendError> {
        let name = model.name()?;
        let dir = model.repository()?;
        let config = BackendConfig::parse(&model.config_json()?, &dir)?;
        let artifact = tlaloc_artifact::Artifact::open(&config.artifact).map_err(|e| {
            BackendError::invalid(format!(
                "model {name}: the artifact {} does not open: {e}",
                config.artifact.display()
            ))
        })?;
        config.check_batch(artifact.manifest().ladder.max_decode_batch())?;
        let codec = Codec::from_artifact(&artifact)?;
        drop(artifact);
        let mut options = LoadOptions {
            plugin: PluginRequest::parse(&config.plugin),
            ..LoadOptions::default()
        };
        if let Some(cache) = &config.compile_cache {
            options.compile_cache = Some(cache.clone());
        }
        let started = Instant::now();
        let engine = Engine::load_with_options(&config.artifact, options, EngineOptions::default())
            .map_err(|e| {
                BackendError::new(
                    Code::Internal,
                    format!("model {name}: the engine did not start: {e}"),
                )
            })?;
        let gauges = families().and_then(|f| {
            Some(Gauges {
                used: f.used.gauge(&name).ok()?,
                total: f.total.gauge(&name).ok()?,
                sequences: f.sequences.gauge(&name).ok()?,
            })
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tlaloc-triton")
            .enable_time()
            .build()
            .map_err(|e| BackendError::new(Code::Internal, format!("responder threads: {e}")))?;
        let mode = match &config.mode {
            Mode::Generate => "generate".to_owned(),
            Mode::Sequence(c) => format!("sequence, idle timeout {} ms", c.idle.as_millis()),
        };
        let stats = engine.stats();
        ffi::log(
            ffi::LOG_INFO,
            &format!(
                "tlaloc: model {name} loaded from {} in {} ms ({mode}; {} K/V pages; plugin {})",
                config.artifact.display(),
                started.elapsed().as_millis(),
                stats.kv_pages_total,
                engine
                    .platform()
                    .map(|p| p.plugin_path.display().to_string())
                    .unwrap_or_else(|| config.plugin.clone())
            ),
        );
        let shared = Arc::new(Shared {
            config,
            engine,
            codec,
            sequences: Mutex::new(HashMap::new()),
            gauges,
        });
        runtime.spawn(housekeeping(Arc::clone(&shared)));
        Ok(Self { shared, runtime })
    }

    /// Takes the requests of one Execute: every one is released before this returns.
    pub fn execute(&self, requests: Vec<Request>) {
        for request in requests {
            let factory = match request.response_factory() {
                Ok(f) => f,
                Err(e) => {
                    ffi::log(ffi::LOG_ERROR, &format!("tlaloc: {}", e.message));
                    request.release();
                    continue;
                }
            };
            let prepared = match &self.shared.config.mode {
                Mode::Generate => self.prepare_generate(&request),
                Mode::Sequence(controls) => self.prepare_sequence(&request, controls),
            };
            request.release();
            match prepared {
                Ok(Some(job)) => self.start(job, factory),
                Ok(None) => {
                    // A null request (the sequence batcher's filler): nothing to answer.
                    let _ = factory.send_final_flag();
                }
                Err(e) => {
                    let _ = factory.send_error(&e);
                }
            }
        }
    }

    fn prepare_generate(&self, request: &Request) -> Result<Option<Job>, BackendError> {
        let text = string_input(request, "text_input")?.ok_or_else(|| {
            BackendError::invalid(
                "input text_input is missing; send the prompt as text_input (TYPE_STRING)",
            )
        })?;
        let stream = bool_input(request, "stream")?.unwrap_or(false);
        let exclude_input = bool_input(request, "exclude_input_in_output")?.unwrap_or(false);
        let sampling = params::parse(string_input(request, "sampling_parameters")?.as_deref())?;
        let prompt_ids = self.shared.codec.encode(&text)?;
        Ok(Some(Job {
            client_id: request.id(),
            request: engine_request(prompt_ids, &sampling, None),
            outputs: requested(request, &["text_output", "finish_reason", "output_ids"])?,
            kind: JobKind::Generate {
                stream,
                prefix: if stream || exclude_input {
                    String::new()
                } else {
                    text
                },
            },
        }))
    }

    fn prepare_sequence(
        &self,
        request: &Request,
        controls: &SequenceControls,
    ) -> Result<Option<Job>, BackendError> {
        let key = request.correlation_id().map_err(|e| {
            BackendError::invalid(format!(
                "correlation ID refused ({}); this model's sequences are named by UINT64 correlation IDs: send a numeric sequence_id",
                e.message
            ))
        })?;
        let ids_input = request.input("input_ids")?;
        if key == 0 {
            return Ok(None);
        }
        let start = flag_input(request, &controls.start)?;
        let end = flag_input(request, &controls.end)?;
        let ids_input = ids_input.ok_or_else(|| {
            BackendError::invalid("input input_ids is missing; send the sequence's new tokens as input_ids (TYPE_INT32)")
        })?;
        let prompt_ids = int32_ids(&ids_input)?;
        let sampling = params::parse(string_input(request, "sampling_parameters")?.as_deref())?;
        let engine_request = engine_request(
            prompt_ids,
            &sampling,
            Some(SequenceControl { key, park: !end }),
        );
        let new_tokens = engine_request.prompt_ids.len() + sampling.max_tokens;
        let mut sequences = self.shared.sequences.lock().expect("sequence table");
        if start {
            if sequences.get(&key).is_some_and(|s| s.busy) {
                return Err(BackendError::new(
                    Code::Unavailable,
                    format!(
                        "START of sequence {key} refused: a request of its previous run is still running; send the START after its response"
                    ),
                ));
            }
            let old = sequences.remove(&key);
            if old.is_some() {
                // A re-START of a live sequence: its old pages go first.
                self.shared.engine.release_sequence(key);
            }
            let stats = self.shared.engine.stats();
            let block = self.shared.engine.shape().block_size;
            let freed = old.map(|s| s.tokens.div_ceil(block)).unwrap_or(0);
            let free =
                (stats.kv_pages_total - stats.kv_pages_used + freed).min(stats.kv_pages_total);
            let needed = new_tokens.div_ceil(block);
            if needed > free {
                return Err(BackendError::new(
                    Code::Unavailable,
                    format!(
                        "START of sequence {key} refused: it needs {needed} K/V pages and the pool has {free} free of {} total; end a sequence (END) or wait for idle ones to be reaped",
                        stats.kv_pages_total
                    ),
                ));
            }
            sequences.insert(
                key,
                LiveSequence {
                    tokens: 0,
                    last_active: Instant::now(),
                    busy: true,
                },
            );
        } else {
            let Some(live) = sequences.get_mut(&key) else {
                return Err(BackendError::invalid(format!(
                    "sequence {key} is unknown (never started, ended, or idle past {} ms and reaped); send its first request with START",
                    controls.idle.as_millis()
                )));
            };
            if live.busy {
                return Err(BackendError::new(
                    Code::Unavailable,
                    format!(
                        "sequence {key} refused: its previous request is still running; send the next after its response"
                    ),
                ));
            }
            live.busy = true;
            live.last_active = Instant::now();
        }
        Ok(Some(Job {
            client_id: request.id(),
            request: engine_request,
            outputs: requested(request, &["output_ids", "finish_reason"])?,
            kind: JobKind::Sequence { key, end },
        }))
    }

    fn start(&self, job: Job, factory: ResponseFactory) {
        let shared = Arc::clone(&self.shared);
        let sequence = match job.kind {
            JobKind::Sequence { key, end } => Some((key, end)),
            JobKind::Generate { .. } => None,
        };
        let submitted = shared.engine.submit(job.request.clone());
        let (id, events) = match submitted {
            Ok(s) => s,
            Err(e) => {
                if let Some((key, _)) = sequence {
                    shared.forget(key);
                    shared.engine.release_sequence(key);
                }
                let _ = factory.send_error(&BackendError::invalid(e.to_string()));
                return;
            }
        };
        self.runtime
            .spawn(respond(shared, job, id, events, factory));
    }

    /// Stops the engine (queued requests finish first) and the responder.
    pub fn finalize(self) {
        self.shared.engine.shutdown();
        self.runtime.shutdown_timeout(Duration::from_secs(5));
    }
}

impl Shared {
    /// Drops `key` from the table (ended, failed, aborted or reaped).
    fn forget(&self, key: u64) {
        self.sequences.lock().expect("sequence table").remove(&key);
    }

    fn refresh_gauges(&self) {
        if let Some(g) = &self.gauges {
            let stats = self.engine.stats();
            g.used.set(stats.kv_pages_used as f64);
            g.total.set(stats.kv_pages_total as f64);
            let live = self.sequences.lock().expect("sequence table").len();
            g.sequences.set(live as f64);
        }
    }
}

#[derive(Debug)]
struct Job {
    /// The client's request ID (for the log).
    client_id: String,
    request: GenerateRequest,
    outputs: Vec<&'static str>,
    kind: JobKind,
}

#[derive(Debug)]
enum JobKind {
    Generate { stream: bool, prefix: String },
    Sequence { key: u64, end: bool },
}

fn engine_request(
    prompt_ids: Vec<u32>,
    sampling: &Sampling,
    sequence: Option<SequenceControl>,
) -> GenerateRequest {
    GenerateRequest {
        prompt_ids,
        sampling: sampling.sampling.clone(),
        stop: sampling.stop.clone(),
        max_tokens: Some(sampling.max_tokens),
        logprobs: None,
        ignore_eos: sampling.ignore_eos,
        sequence,
        constraint: None,
    }
}

/// The outputs to send: those asked for among `known`, or all of them when none is named.
fn requested(request: &Request, known: &[&'static str]) -> Result<Vec<&'static str>, BackendError> {
    let asked = request.requested_outputs()?;
    if asked.is_empty() {
        return Ok(known.to_vec());
    }
    Ok(known
        .iter()
        .copied()
        .filter(|k| asked.iter().any(|a| a == k))
        .collect())
}

fn string_input(request: &Request, name: &str) -> Result<Option<String>, BackendError> {
    let Some(input) = request.input(name)? else {
        return Ok(None);
    };
    if input.data_type != ffi::data_type::BYTES {
        return Err(BackendError::invalid(format!(
            "input {name} refused: it must be TYPE_STRING"
        )));
    }
    let bytes = &input.bytes;
    let Some(length) = bytes.get(..4) else {
        return Ok(Some(String::new()));
    };
    let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
    let body = bytes.get(4..4 + length).ok_or_else(|| {
        BackendError::invalid(format!("input {name} refused: its string is cut short"))
    })?;
    match std::str::from_utf8(body) {
        Ok(text) => Ok(Some(text.to_owned())),
        Err(e) => Err(BackendError::invalid(format!(
            "input {name} refused: not UTF-8 (invalid byte at offset {}); send UTF-8 text",
            e.valid_up_to()
        ))),
    }
}

fn bool_input(request: &Request, name: &str) -> Result<Option<bool>, BackendError> {
    Ok(request
        .input(name)?
        .map(|i| i.bytes.iter().any(|&b| b != 0)))
}

/// A control input: true when any of its bytes is not zero (`int32`, `fp32` and `bool`
/// encodings of false are all zero bytes). A missing one is false.
fn flag_input(request: &Request, name: &str) -> Result<bool, BackendError> {
    Ok(bool_input(request, name)?.unwrap_or(false))
}

fn int32_ids(input: &ffi::Input) -> Result<Vec<u32>, BackendError> {
    if input.data_type != ffi::data_type::INT32 {
        return Err(BackendError::invalid(
            "input input_ids refused: it must be TYPE_INT32",
        ));
    }
    input
        .bytes
        .chunks_exact(4)
        .map(|c| {
            let v = i32::from_le_bytes(c.try_into().expect("4 bytes"));
            u32::try_from(v).map_err(|_| {
                BackendError::invalid(format!("input_ids refused: token id {v} is negative"))
            })
        })
        .collect()
}

/// Answers one request from its event stream.
async fn respond(
    shared: Arc<Shared>,
    job: Job,
    id: RequestId,
    mut events: UnboundedReceiver<TokenEvent>,
    factory: ResponseFactory,
) {
    let outcome = match &job.kind {
        JobKind::Generate { stream, prefix } => {
            generate(
                &shared,
                id,
                &mut events,
                &factory,
                *stream,
                prefix,
                &job.outputs,
            )
            .await
        }
        JobKind::Sequence { key, end } => {
            let outcome = sequence(&shared, id, &mut events, &factory, &job).await;
            // The table is settled before the response goes out: the client's next request
            // may arrive as soon as it does.
            {
                let mut table = shared.sequences.lock().expect("sequence table");
                match (&outcome, *end) {
                    (Ok((tokens, _)), false) => match table.get_mut(key) {
                        Some(live) => {
                            live.busy = false;
                            live.tokens += tokens;
                            live.last_active = Instant::now();
                        }
                        // Dropped from the table while it ran: nothing may stay parked.
                        None => shared.engine.release_sequence(*key),
                    },
                    (Ok(_), true) => {
                        table.remove(key);
                    }
                    (Err(_), _) => {
                        // A failed or cancelled request ends its sequence (the engine ends it
                        // too; releasing makes sure nothing stays parked).
                        table.remove(key);
                        shared.engine.release_sequence(*key);
                    }
                }
            }
            outcome.and_then(|(_, outputs)| factory.send(&outputs, true))
        }
    };
    if let Err(e) = outcome {
        if e.code == Code::Cancelled {
            ffi::log(
                ffi::LOG_INFO,
                &format!(
                    "tlaloc: model {}: request '{}' (engine request {id}) cancelled by the client; aborted and its K/V pages freed",
                    shared.config.name, job.client_id
                ),
            );
        }
        let _ = factory.send_error(&e);
    }
    shared.refresh_gauges();
}

/// What the engine's stream said next, with the cancellation check folded in.
enum Next {
    Token(u32),
    Finished(FinishReason),
    Failed(BackendError),
    Cancelled,
}

async fn next_event(
    events: &mut UnboundedReceiver<TokenEvent>,
    factory: &ResponseFactory,
    engine: &EngineHandle,
    id: RequestId,
) -> Next {
    let mut poll = tokio::time::interval(CANCEL_POLL);
    loop {
        tokio::select! {
            event = events.recv() => return classify(event),
            _ = poll.tick() => {
                if factory.is_cancelled() {
                    engine.abort(id);
                    // Wait for the engine to confirm: its pages are free when it does.
                    while let Some(event) = events.recv().await {
                        if !matches!(event, TokenEvent::Token { .. }) {
                            break;
                        }
                    }
                    return Next::Cancelled;
                }
            }
        }
    }
}

fn classify(event: Option<TokenEvent>) -> Next {
    match event {
        Some(TokenEvent::Token { id, .. }) => Next::Token(id),
        Some(TokenEvent::Finished { reason, .. }) => Next::Finished(reason),
        Some(TokenEvent::Error { message }) => {
            Next::Failed(BackendError::new(Code::Internal, message))
        }
        None => Next::Failed(BackendError::new(
            Code::Internal,
            "the engine stopped before the request finished",
        )),
    }
}

fn cancelled(id: RequestId) -> BackendError {
    BackendError::new(
        Code::Cancelled,
        format!("request {id} cancelled by the client; its K/V pages are freed"),
    )
}

fn finish_label(reason: FinishReason) -> &'static str {
    reason.as_str()
}

fn text_tensor(name: &'static str, text: String, batch: bool) -> OutputTensor {
    OutputTensor {
        name,
        shape: if batch { vec![1, 1] } else { vec![1] },
        data: TensorData::Bytes(vec![text.into_bytes()]),
    }
}

fn ids_tensor(name: &'static str, ids: &[u32], batch: bool) -> OutputTensor {
    let n = ids.len() as i64;
    OutputTensor {
        name,
        shape: if batch { vec![1, n] } else { vec![n] },
        data: TensorData::Int32(ids.iter().map(|&i| i as i32).collect()),
    }
}

fn select(outputs: &[&'static str], tensors: Vec<OutputTensor>) -> Vec<OutputTensor> {
    tensors
        .into_iter()
        .filter(|t| outputs.contains(&t.name))
        .collect()
}

async fn generate(
    shared: &Shared,
    id: RequestId,
    events: &mut UnboundedReceiver<TokenEvent>,
    factory: &ResponseFactory,
    stream: bool,
    prefix: &str,
    outputs: &[&'static str],
) -> Result<(), BackendError> {
    let codec = &shared.codec;
    let mut text = IncrementalText::default();
    let mut pending = Vec::new();
    let mut held = String::new();
    let mut next = next_event(events, factory, &shared.engine, id).await;
    loop {
        match next {
            Next::Token(token) => {
                let piece = text.push(codec, token)?;
                pending.push(token);
                // The engine sends a request's last token and its finish together: look ahead
                // so that the last token rides on the final response.
                let ahead = match events.try_recv() {
                    Ok(event) => Some(classify(Some(event))),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => Some(classify(None)),
                };
                if stream && !matches!(ahead, Some(Next::Finished(_))) {
                    factory.send(
                        &select(
                            outputs,
                            vec![
                                text_tensor("text_output", piece, false),
                                ids_tensor("output_ids", &pending, false),
                            ],
                        ),
                        false,
                    )?;
                    pending.clear();
                } else if stream {
                    // Held for the final response.
                    held.push_str(&piece);
                }
                next = match ahead {
                    Some(n) => n,
                    None => next_event(events, factory, &shared.engine, id).await,
                };
            }
            Next::Finished(reason) => {
                let body = if stream {
                    held.push_str(&text.flush(codec)?);
                    std::mem::take(&mut held)
                } else {
                    format!("{prefix}{}", codec.decode(text.ids())?)
                };
                let ids: Vec<u32> = if stream { pending } else { text.ids().to_vec() };
                return factory.send(
                    &select(
                        outputs,
                        vec![
                            text_tensor("text_output", body, false),
                            text_tensor("finish_reason", finish_label(reason).into(), false),
                            ids_tensor("output_ids", &ids, false),
                        ],
                    ),
                    true,
                );
            }
            Next::Failed(e) => return Err(e),
            Next::Cancelled => return Err(cancelled(id)),
        }
    }
}

/// Runs one sequence-mode request; returns the tokens it added to its sequence and its final
/// response's outputs (sent by the caller).
async fn sequence(
    shared: &Shared,
    id: RequestId,
    events: &mut UnboundedReceiver<TokenEvent>,
    factory: &ResponseFactory,
    job: &Job,
) -> Result<(usize, Vec<OutputTensor>), BackendError> {
    let mut ids = Vec::new();
    loop {
        match next_event(events, factory, &shared.engine, id).await {
            Next::Token(token) => ids.push(token),
            Next::Finished(FinishReason::Abort) => return Err(cancelled(id)),
            Next::Finished(reason) => {
                let outputs = select(
                    &job.outputs,
                    vec![
                        ids_tensor("output_ids", &ids, true),
                        text_tensor("finish_reason", finish_label(reason).into(), true),
                    ],
                );
                return Ok((job.request.prompt_ids.len() + ids.len(), outputs));
            }
            Next::Failed(e) => return Err(e),
            Next::Cancelled => return Err(cancelled(id)),
        }
    }
}

/// Refreshes the gauges and reaps idle sequences.
async fn housekeeping(shared: Arc<Shared>) {
    let idle = match &shared.config.mode {
        Mode::Sequence(c) => Some(c.idle),
        Mode::Generate => None,
    };
    let mut tick = tokio::time::interval(GAUGE_PERIOD);
    loop {
        tick.tick().await;
        if let Some(idle) = idle {
            let reaped: Vec<(u64, Duration)> = {
                let mut table = shared.sequences.lock().expect("sequence table");
                let expired: Vec<(u64, Duration)> = table
                    .iter()
                    .filter(|(_, s)| !s.busy && s.last_active.elapsed() > idle)
                    .map(|(k, s)| (*k, s.last_active.elapsed()))
                    .collect();
                for (key, _) in &expired {
                    table.remove(key);
                }
                expired
            };
            for (key, quiet) in reaped {
                shared.engine.release_sequence(key);
                ffi::log(
                    ffi::LOG_INFO,
                    &format!(
                        "tlaloc: model {}: sequence {key} idle for {} ms (limit {} ms); its K/V pages are freed",
                        shared.config.name,
                        quiet.as_millis(),
                        idle.as_millis()
                    ),
                );
            }
        }
        shared.refresh_gauges();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_version_check_takes_the_declared_major_and_a_later_minor() {
        assert!(check_api_version(1, 19).is_ok());
        assert!(check_api_version(1, 20).is_ok());
        let e = check_api_version(1, 18).unwrap_err();
        assert!(e.message.contains("API 1.18 refused"), "{}", e.message);
        assert!(check_api_version(2, 0).is_err());
    }
}
