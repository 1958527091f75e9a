//! The engine: one thread that owns the model, the scheduler and the page pool, and the
//! cloneable handle through which the server and the CLI submit, abort and observe requests.
//!
//! The engine thread is an actor: commands reach it over a channel, it interleaves them with
//! steps, and it answers each request through that request's own unbounded token channel
//! (`tokio::sync::mpsc`, so an async server can await events while this thread stays
//! synchronous). Nothing is shared under a lock but the metrics snapshot, which the thread
//! rewrites after every step so that `stats()` never waits on a step.
//!
//! Submissions are validated on the caller's thread (the limits are fixed at start), so a
//! refused request is answered at once, by name, without a round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::executor::{EntryKind, LoadTimings, ModelExecutor, ModelShape, StepTimings};
use crate::model::Platform;
use crate::prefix_cache::PrefixCacheStats;

use crate::request::{
    Finish, FinishReason, GenerateRequest, Refusal, RequestId, RequestTimings, SequenceKey,
    TokenUpdate, Usage, ValidatedRequest,
};
use crate::scheduler::{DEFAULT_MAX_PREFILL_TOKENS, Scheduler, ShapeError};

/// One event of a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// A generated token.
    Token {
        /// Its id.
        id: u32,
        /// Its log-probability, when asked for.
        logprob: Option<f32>,
        /// The most likely tokens and their log-probabilities, when asked for.
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request ended (always the last event, unless `Error` is).
    Finished {
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Time split.
        timings: RequestTimings,
        /// When the engine produced the request's first token and its end, with its step
        /// counts then (stamped by the engine, so a listener that reads events late still
        /// learns when they happened).
        marks: Box<StepMarks>,
    },
    /// The request failed inside the engine (always the last event).
    Error {
        /// What went wrong.
        message: String,
    },
}

/// The engine refused or could not serve.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A request refused at submission.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The engine is shutting down or gone.
    #[error("the engine is stopped and takes no new requests")]
    Stopped,
    /// The model's ladder or pool cannot be scheduled.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The model failed to load.
    #[error("the model failed to load: {0}")]
    Load(String),
    /// A request failed inside the engine.
    #[error("request {id} failed: {message}")]
    Request { id: RequestId, message: String },
}

/// Cumulative step counts and host-time split, for `bench` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Prefill steps run.
    pub prefill_steps: u64,
    /// Prompt tokens those steps processed.
    pub prefill_tokens: u64,
    /// Rows those steps prefilled (live rows, not padding): more than the steps when prompts
    /// were prefilled together.
    pub prefill_rows: u64,
    /// Time of prefill steps, by phase.
    pub prefill_time: StepTimings,
    /// Decode steps run.
    pub decode_steps: u64,
    /// Rows those steps decoded (live rows, not padding).
    pub decode_rows: u64,
    /// Time of decode steps, by phase.
    pub decode_time: StepTimings,
    /// Decode steps that ran chained after another on the device (their token ids never
    /// came through the host).
    pub decode_chained_steps: u64,
}

/// The engine's clock and cumulative step counts at a moment of a request's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepMark {
    /// When.
    pub at: Instant,
    /// The engine's step counts right after the step that produced it.
    pub steps: StepStats,
}

/// A finished request's marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepMarks {
    /// Its first generated token (none when it ended before one).
    pub first_token: Option<StepMark>,
    /// Its end.
    pub finished: StepMark,
}

/// A snapshot of the engine's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences admitted.
    pub running: usize,
    /// Sequences queued.
    pub waiting: usize,
    /// Sequences parked between requests (their pages count as held).
    pub parked: usize,
    /// K/V pages held.
    pub kv_pages_used: usize,
    /// K/V pages that can be held.
    pub kv_pages_total: usize,
    /// Prompt tokens of all requests accepted.
    pub prompt_tokens_total: u64,
    /// Tokens generated.
    pub generation_tokens_total: u64,
    /// Requests ended, by any reason.
    pub requests_finished: u64,
    /// Preemptions by recompute.
    pub preemptions_total: u64,
    /// K/V pages holding a cached prefix block (held by sequences or kept for reuse).
    pub kv_pages_cached: usize,
    /// Prefix cache lookups, hits and hit tokens (all zero with the cache off).
    pub prefix_cache: PrefixCacheStats,
    /// Steps and their time.
    pub steps: StepStats,
}

/// How the engine schedules, beyond what the executor decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Automatic prefix caching: full blocks of K/V shared between sequences whose tokens start
    /// the same way, so that a prompt is prefilled only from its first uncached block (on by
    /// default).
    pub prefix_cache: bool,
    /// The most tokens one prefill step computes: its entry's batch times its chunk, padding
    /// included ([`Scheduler::set_max_prefill_tokens`]; default
    /// [`DEFAULT_MAX_PREFILL_TOKENS`]).
    pub max_prefill_tokens: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            max_prefill_tokens: DEFAULT_MAX_PREFILL_TOKENS,
        }
    }
}

/// The outcome of [`EngineHandle::generate_blocking`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateResult {
    /// The request's id.
    pub id: RequestId,
    /// The generated token ids.
    pub token_ids: Vec<u32>,
    /// Each token's log-probability (when asked for).
    pub logprobs: Vec<Option<f32>>,
    /// Each token's top alternatives (when asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Time split.
    pub timings: RequestTimings,
}

enum Command {
    Submit {
        id: RequestId,
        request: Box<ValidatedRequest>,
        arrived: Instant,
        events: UnboundedSender<TokenEvent>,
    },
    Abort(RequestId),
    Release(SequenceKey),
    Shutdown,
}

#[derive(Debug)]
struct Shared {
    commands: Mutex<Option<mpsc::Sender<Command>>>,
    next_id: AtomicU64,
    accepting: AtomicBool,
    shape: ModelShape,
    load_timings: Option<LoadTimings>,
    platform: Option<Platform>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Submit { id, .. } => write!(f, "Submit({id})"),
            Command::Abort(id) => write!(f, "Abort({id})"),
            Command::Release(key) => write!(f, "Release({key})"),
            Command::Shutdown => f.write_str("Shutdown"),
        }
    }
}

/// What the engine thread reports once the executor is built.
struct Ready {
    shape: ModelShape,
    load_timings: Option<LoadTimings>,
    platform: Option<Platform>,
}

/// Starts engine threads.
#[derive(Debug)]
pub struct Engine;

impl Engine {
    /// Starts the engine thread over an executor that can move to it, with the default
    /// [`EngineOptions`].
    pub fn start<E>(executor: E) -> Result<EngineHandle, EngineError>
    where
        E: ModelExecutor + Send + 'static,
    {
        Self::start_with_options(executor, EngineOptions::default())
    }

    /// Starts the engine thread over an executor that can move to it. The prefix cache's
    /// identity of the model is its shape (an executor that is not an artifact has no other).
    pub fn start_with_options<E>(
        executor: E,
        options: EngineOptions,
    ) -> Result<EngineHandle, EngineError>
    where
        E: ModelExecutor + Send + 'static,
    {
        Self::spawn(
            move || Ok::<_, std::convert::Infallible>(executor),
            None,
            options,
        )
    }

    /// Loads the artifact in `dir` onto a PJRT device and starts the engine over it, with the
    /// default [`EngineOptions`].
    pub fn load(
        dir: impl Into<std::path::PathBuf>,
        options: crate::model::LoadOptions,
    ) -> Result<EngineHandle, EngineError> {
        Self::load_with_options(dir, options, EngineOptions::default())
    }

    /// Loads the artifact in `dir` onto a PJRT device and starts the engine over it. The prefix
    /// cache's identity of the model is the artifact's manifest (its weights' and programs'
    /// hashes, its dtype, its configuration).
    pub fn load_with_options(
        dir: impl Into<std::path::PathBuf>,
        options: crate::model::LoadOptions,
        engine: EngineOptions,
    ) -> Result<EngineHandle, EngineError> {
        let dir = dir.into();
        Self::spawn(
            move || crate::model::Model::load(&dir, &options),
            Some(|model: &crate::model::Model| {
                format!("{:?}", model.artifact().manifest()).into_bytes()
            }),
            engine,
        )
    }

    /// Starts the engine thread and builds the executor on it (for executors that must stay on
    /// the thread that made them); waits until it is built.
    pub fn start_with<E, F, Err>(make: F) -> Result<EngineHandle, EngineError>
    where
        E: ModelExecutor + 'static,
        F: FnOnce() -> Result<E, Err> + Send + 'static,
        Err: std::fmt::Display,
    {
        Self::spawn(make, None, EngineOptions::default())
    }

    /// Starts the engine thread, builds the executor on it, and names the model for the prefix
    /// cache by `identity` (by its shape when `None`).
    fn spawn<E, F, Err>(
        make: F,
        identity: Option<fn(&E) -> Vec<u8>>,
        options: EngineOptions,
    ) -> Result<EngineHandle, EngineError>
    where
        E: ModelExecutor + 'static,
        F: FnOnce() -> Result<E, Err> + Send + 'static,
        Err: std::fmt::Display,
    {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready, EngineError>>();
        let (command_tx, command_rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("tlaloc-engine".into())
            .spawn(move || {
                let executor = match make() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(EngineError::Load(e.to_string())));
                        return;
                    }
                };
                let scheduler = match Scheduler::new(executor.shape()) {
                    Ok(mut s) => {
                        s.set_decode_exploration(executor.all_entries_compiled());
                        s.set_max_prefill_tokens(options.max_prefill_tokens);
                        if options.prefix_cache {
                            let id = match identity {
                                Some(of) => of(&executor),
                                None => format!("{:?}", executor.shape()).into_bytes(),
                            };
                            s.set_prefix_cache(Some(&id));
                        }
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(Ready {
                    shape: executor.shape().clone(),
                    load_timings: executor.load_timings(),
                    platform: executor.platform(),
                }));
                let mut actor = Actor {
                    executor,
                    scheduler,
                    listeners: HashMap::new(),
                    first_tokens: HashMap::new(),
                    stats: thread_stats,
                    totals: EngineStats::default(),
                };
                actor.run(command_rx);
            })
            .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))?;
        let Ready {
            shape,
            load_timings,
            platform,
        } = match ready_rx.recv() {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(EngineError::Load(
                    "the engine thread ended while loading".into(),
                ));
            }
        };
        {
            let mut s = stats.lock().expect("engine stats lock");
            s.kv_pages_total = shape.allocatable_pages();
        }
        let shared = Shared {
            commands: Mutex::new(Some(command_tx)),
            next_id: AtomicU64::new(1),
            accepting: AtomicBool::new(true),
            shape,
            load_timings,
            platform,
            thread: Mutex::new(Some(thread)),
        };
        Ok(EngineHandle {
            shared: Arc::new(shared),
            stats,
        })
    }
}

/// The cloneable, thread-safe way in to a running engine.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    stats: Arc<Mutex<EngineStats>>,
}

impl EngineHandle {
    /// Queues a request; returns its id and its event stream, or the refusal, named.
    /// Dropping the receiver aborts the request.
    pub fn submit(
        &self,
        request: GenerateRequest,
    ) -> Result<(RequestId, UnboundedReceiver<TokenEvent>), EngineError> {
        if !self.shared.accepting.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        let request = request.validate(&self.shared.shape)?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = unbounded_channel();
        self.send(Command::Submit {
            id,
            request: Box::new(request),
            arrived: Instant::now(),
            events,
        })?;
        Ok((id, receiver))
    }

    /// Ends a request; its pages are freed before the next step and its stream gets
    /// `Finished { reason: Abort }`. Aborting an unknown or ended request does nothing.
    pub fn abort(&self, id: RequestId) {
        let _ = self.send(Command::Abort(id));
    }

    /// Ends the sequence parked under `key` ([`crate::SequenceControl`]), freeing its pages
    /// before the next step. Releasing a key with nothing parked does nothing; a request still
    /// running for it is not touched (it ends its sequence unless it asked to park it).
    pub fn release_sequence(&self, key: SequenceKey) {
        let _ = self.send(Command::Release(key));
    }

    /// The current counts (never waits on a step).
    pub fn stats(&self) -> EngineStats {
        *self.stats.lock().expect("engine stats lock")
    }

    /// The model's shape, ladder and bytes-per-step inputs.
    pub fn shape(&self) -> &ModelShape {
        &self.shared.shape
    }

    /// The longest prompt + max_tokens served.
    pub fn max_context(&self) -> usize {
        self.shared.shape.ladder.max_context()
    }

    /// Where start-up time went (when the executor measured it).
    pub fn load_timings(&self) -> Option<&LoadTimings> {
        self.shared.load_timings.as_ref()
    }

    /// The plugin and device the model runs on (none for a test executor).
    pub fn platform(&self) -> Option<&Platform> {
        self.shared.platform.as_ref()
    }

    /// Stops taking requests, lets the queued and running ones finish, then ends the engine
    /// thread and waits for it.
    pub fn shutdown(&self) {
        self.shared.accepting.store(false, Ordering::Release);
        let _ = self.send(Command::Shutdown);
        let thread = self
            .shared
            .thread
            .lock()
            .expect("engine thread lock")
            .take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("the engine thread panicked");
        }
        self.shared
            .commands
            .lock()
            .expect("engine command lock")
            .take();
    }

    /// Submits and waits for the whole result (for the CLI; must not be called from inside an
    /// async runtime, whose threads may not block).
    pub fn generate_blocking(
        &self,
        request: GenerateRequest,
    ) -> Result<GenerateResult, EngineError> {
        let (id, mut events) = self.submit(request)?;
        let mut result = GenerateResult {
            id,
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            finish_reason: FinishReason::Abort,
            usage: Usage::default(),
            timings: RequestTimings::default(),
        };
        while let Some(event) = events.blocking_recv() {
            match event {
                TokenEvent::Token {
                    id: token,
                    logprob,
                    top_logprobs,
                } => {
                    result.token_ids.push(token);
                    result.logprobs.push(logprob);
                    result.top_logprobs.push(top_logprobs);
                }
                TokenEvent::Finished {
                    reason,
                    usage,
                    timings,
                    ..
                } => {
                    result.finish_reason = reason;
                    result.usage = usage;
                    result.timings = timings;
                    return Ok(result);
                }
                TokenEvent::Error { message } => return Err(EngineError::Request { id, message }),
            }
        }
        Err(EngineError::Request {
            id,
            message: "the engine stopped before the request finished".into(),
        })
    }

    fn send(&self, command: Command) -> Result<(), EngineError> {
        let commands = self.shared.commands.lock().expect("engine command lock");
        let sender = commands.as_ref().ok_or(EngineError::Stopped)?;
        sender.send(command).map_err(|_| EngineError::Stopped)
    }
}

struct Actor<E> {
    executor: E,
    scheduler: Scheduler,
    listeners: HashMap<RequestId, UnboundedSender<TokenEvent>>,
    /// Each running request's first-token mark, until it finishes.
    first_tokens: HashMap<RequestId, StepMark>,
    stats: Arc<Mutex<EngineStats>>,
    totals: EngineStats,
}

impl<E: ModelExecutor> Actor<E> {
    fn run(&mut self, commands: mpsc::Receiver<Command>) {
        let mut shutting_down = false;
        let mut disconnected = false;
        loop {
            if !self.scheduler.has_work() {
                if shutting_down || disconnected {
                    break;
                }
                match commands.recv() {
                    Ok(command) => shutting_down |= self.handle(command),
                    Err(_) => break,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(command) => shutting_down |= self.handle(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        disconnected = true;
                        break;
                    }
                }
            }
            self.drop_closed_listeners();
            if self.scheduler.has_work() {
                self.step();
            }
            self.publish();
        }
        self.publish();
    }

    /// Returns whether the command asks to shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit {
                id,
                request,
                arrived,
                events,
            } => {
                let prompt_tokens = request.request().prompt_ids.len() as u64;
                match self.scheduler.add_arrived(id, *request, arrived) {
                    Ok(()) => {
                        self.totals.prompt_tokens_total += prompt_tokens;
                        self.listeners.insert(id, events);
                    }
                    // Only a continued sequence is refused here (it no longer fits, or
                    // another request holds it); everything else was refused at submission.
                    Err(refusal) => {
                        let _ = events.send(TokenEvent::Error {
                            message: refusal.to_string(),
                        });
                    }
                }
                false
            }
            Command::Abort(id) => {
                self.abort(id);
                false
            }
            Command::Release(key) => {
                self.scheduler.release(key);
                false
            }
            Command::Shutdown => true,
        }
    }

    fn abort(&mut self, id: RequestId) {
        if let Some(finish) = self.scheduler.abort(id) {
            self.totals.requests_finished += 1;
            // Counts first, so that a listener woken by the event sees the pages freed.
            self.publish();
            if let Some(listener) = self.listeners.remove(&id) {
                let marks = self.marks_at_finish(id);
                let _ = listener.send(finished_event(finish, marks));
            }
        }
    }

    fn drop_closed_listeners(&mut self) {
        let closed: Vec<RequestId> = self
            .listeners
            .iter()
            .filter(|(_, l)| l.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in closed {
            tracing::debug!(id, "listener gone; aborting");
            self.abort(id);
        }
    }

    fn step(&mut self) {
        let started = Instant::now();
        let step = match self.scheduler.schedule() {
            Ok(Some(step)) => step,
            Ok(None) => return,
            Err(unschedulable) => {
                for (id, _) in unschedulable.ended {
                    self.fail(id, unschedulable.error.to_string());
                }
                return;
            }
        };
        let build = started.elapsed();
        let started = Instant::now();
        let result = if step.chain.is_empty() {
            self.executor
                .step(&step.entry, &step.inputs)
                .map(|output| vec![output])
        } else {
            let mut steps = Vec::with_capacity(1 + step.chain.len());
            steps.push(step.inputs.clone());
            steps.extend(step.chain.iter().cloned());
            self.executor.decode_chain(&step.entry, &steps)
        };
        let outputs = match result {
            Ok(outputs) => outputs,
            Err(err) => {
                // The pools' state is unknown after a failed step: end everything in flight.
                tracing::error!(entry = %step.entry, error = %err, "step failed");
                for (id, _) in self.scheduler.abort_all() {
                    self.fail(id, err.to_string());
                }
                return;
            }
        };
        let wall = started.elapsed();
        if step.entry.kind == EntryKind::Decode {
            let per_step = wall / outputs.len() as u32;
            tracing::trace!(entry = %step.entry, rows = step.rows.len(), steps = outputs.len(), us = per_step.as_micros() as u64, "decode");
            self.scheduler.observe_decode_cost(step.entry, per_step);
            self.observe_decode_time(per_step);
        }
        let phases = outputs.iter().fold(StepTimings::default(), |mut sum, o| {
            sum += o.timings;
            sum
        });
        let other = wall.saturating_sub(phases.upload + phases.execute + phases.readback);
        for (k, output) in outputs.iter().enumerate() {
            let mut timings = output.timings;
            // The host's own time belongs to the chain's first step.
            if k == 0 {
                timings.build = build;
                timings.other = other;
            }
            let steps = &mut self.totals.steps;
            match step.entry.kind {
                EntryKind::Prefill => {
                    steps.prefill_steps += 1;
                    steps.prefill_tokens += step.rows.iter().map(|r| r.tokens as u64).sum::<u64>();
                    steps.prefill_rows += step.rows.len() as u64;
                    steps.prefill_time += timings;
                }
                EntryKind::Decode => {
                    steps.decode_steps += 1;
                    steps.decode_rows += step.rows.len() as u64;
                    steps.decode_time += timings;
                    steps.decode_chained_steps += u64::from(k > 0);
                }
            }
            match self.scheduler.complete(&step, output) {
                Ok(updates) => self.deliver(updates),
                Err(err) => {
                    tracing::error!(error = %err, "step output refused");
                    for (id, _) in self.scheduler.abort_all() {
                        self.fail(id, err.to_string());
                    }
                    return;
                }
            }
        }
    }

    /// Sets the next decode chain from the measured time of one decode step: as many steps
    /// as fit in the executor's [`decode_chain_window`](ModelExecutor::decode_chain_window) (tokens then stream in bursts no longer than that),
    /// at most the executor's limit. A step long enough that the host's part is negligible
    /// (a CPU) is never chained.
    fn observe_decode_time(&mut self, per_step: Duration) {
        let chain = decode_chain_for(
            per_step,
            self.executor.decode_chain_window(),
            self.executor.max_decode_chain(),
        );
        self.scheduler.set_max_decode_chain(chain);
    }

    fn deliver(&mut self, updates: Vec<TokenUpdate>) {
        let mut outbox = Vec::with_capacity(updates.len());
        for update in updates {
            self.totals.generation_tokens_total += 1;
            let token = TokenEvent::Token {
                id: update.sampled.token,
                logprob: update.sampled.logprob,
                top_logprobs: update.sampled.top_logprobs,
            };
            let now = self.mark();
            self.first_tokens.entry(update.id).or_insert(now);
            let finished = update.finish.map(|finish| {
                self.totals.requests_finished += 1;
                let marks = self.marks_at_finish(update.id);
                finished_event(finish, marks)
            });
            let listener = if finished.is_some() {
                self.listeners.remove(&update.id)
            } else {
                self.listeners.get(&update.id).cloned()
            };
            if let Some(listener) = listener {
                outbox.push((update.id, listener, token, finished));
            }
        }
        // Counts first, so that a listener woken by an event sees the step's pages and counts.
        self.publish();
        let mut gone = Vec::new();
        for (id, listener, token, finished) in outbox {
            let sent = listener.send(token).is_ok();
            match finished {
                Some(event) => {
                    let _ = listener.send(event);
                }
                None if !sent => gone.push(id),
                None => {}
            }
        }
        for id in gone {
            self.abort(id);
        }
    }

    fn mark(&self) -> StepMark {
        StepMark {
            at: Instant::now(),
            steps: self.totals.steps,
        }
    }

    /// The marks of request `id` finishing now (its first-token mark is then forgotten).
    fn marks_at_finish(&mut self, id: RequestId) -> StepMarks {
        StepMarks {
            first_token: self.first_tokens.remove(&id),
            finished: self.mark(),
        }
    }

    fn fail(&mut self, id: RequestId, message: String) {
        self.first_tokens.remove(&id);
        self.totals.requests_finished += 1;
        self.publish();
        if let Some(listener) = self.listeners.remove(&id) {
            let _ = listener.send(TokenEvent::Error { message });
        }
    }

    fn publish(&mut self) {
        let counts = self.scheduler.counts();
        let mut stats = self.stats.lock().expect("engine stats lock");
        *stats = EngineStats {
            running: counts.running,
            waiting: counts.waiting,
            parked: counts.parked,
            kv_pages_used: counts.pages_used,
            kv_pages_total: counts.pages_total,
            preemptions_total: counts.preemptions,
            kv_pages_cached: counts.pages_cached,
            prefix_cache: counts.prefix_cache,
            ..self.totals
        };
    }
}

/// The decode chain for a measured step time: the steps that fit in `window`, at least 1, at
/// most `limit`.
fn decode_chain_for(per_step: Duration, window: Duration, limit: usize) -> usize {
    let per_step = per_step.max(Duration::from_micros(1));
    let fits = usize::try_from(window.as_nanos() / per_step.as_nanos()).unwrap_or(usize::MAX);
    fits.clamp(1, limit.max(1))
}

fn finished_event(finish: Finish, marks: StepMarks) -> TokenEvent {
    TokenEvent::Finished {
        reason: finish.reason,
        usage: finish.usage,
        timings: finish.timings,
        marks: Box::new(marks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::DECODE_CHAIN_WINDOW;

    #[test]
    fn a_chain_fills_the_window_within_the_limit_and_a_slow_step_is_never_chained() {
        let ms = Duration::from_millis;
        // A GPU-like step: as many as fit in 20 ms, capped by the executor's limit.
        assert_eq!(
            decode_chain_for(Duration::from_micros(2200), DECODE_CHAIN_WINDOW, 8),
            8
        );
        assert_eq!(decode_chain_for(ms(5), DECODE_CHAIN_WINDOW, 8), 4);
        assert_eq!(decode_chain_for(ms(7), DECODE_CHAIN_WINDOW, 8), 2);
        // A step longer than the window (a CPU): no chain.
        assert_eq!(decode_chain_for(ms(21), DECODE_CHAIN_WINDOW, 8), 1);
        assert_eq!(decode_chain_for(ms(65), DECODE_CHAIN_WINDOW, 8), 1);
        // Chaining off, and a zero measurement.
        assert_eq!(decode_chain_for(ms(1), DECODE_CHAIN_WINDOW, 1), 1);
        assert_eq!(decode_chain_for(ms(1), DECODE_CHAIN_WINDOW, 0), 1);
        assert_eq!(decode_chain_for(Duration::ZERO, DECODE_CHAIN_WINDOW, 8), 8);
    }
}
