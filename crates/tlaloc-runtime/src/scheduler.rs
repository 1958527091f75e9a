//! Continuous batching: which sequences run in the next step, on which entry, with which inputs.
//!
//! Every sequence is a token list and a count of tokens whose K/V is already in the pools
//! (`computed`). A step processes, for each of its rows, the tokens from `computed` on; when a
//! row reaches the end of its list, the step's output for that row is a new token. A prompt is
//! thus prefilled in chunks of the ladder's prefill sizes (each chunk continuing the earlier
//! one: positions and slots go on from `computed`), and a sequence with exactly one token left
//! is decoded. Preemption by recompute is then only `computed = 0`: the generated tokens are
//! already in the list, so the sequence is prefilled again over prompt + output.
//!
//! Policy: steps alternate between one prefill step (the oldest sequences with prompt tokens
//! left, as many as the largest prefill batch holds) and one decode step (every decoding
//! sequence in one call, on the smallest context bucket that holds the longest row), so that a
//! stream of new prompts cannot starve running decodes. The decode batch bucket is the smallest
//! that fits or the next one up, whichever was measured faster (the smallest runs
//! [`DECODE_STEPS_BEFORE_TRYING`] steps first, then the next is tried for two steps, the first
//! one's time left out): a plugin can compile a one-row step worse than a two- or
//! eight-row one (XLA CPU runs one-row matmuls as single-threaded loops; measured 95 ms/step at
//! batch 1 against 47 ms at batch 2 for SmolLM2 on the lammps plugin, the other way round on
//! xla-cpu-pjrt).
//! A waiting sequence is admitted when the pages its tokens need are free (counting what
//! admitted, not yet prefilled sequences still need) and the running set is under the largest
//! decode batch. When a sequence needs a page and none is free, the youngest running sequence
//! is preempted: its pages freed at once, itself put back at the head of the queue.
//!
//! Row layout inside a prefill step: a row's real tokens are left-aligned; padding tokens after
//! them have token 0, position 0 and slot -1. A row's `seqLens` is its context length after the
//! step (the last real token's position + 1), so its last real token sits at index
//! `seqLens[b] - 1 - positions[b, 0]`. Rows past the live ones follow the padding contract:
//! tokenIds 0, positions 0, blockTables 0, seqLens 1, slotMapping -1.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::block_manager::{BlockManager, BlockPoolError, PageId};
use crate::executor::{Ladder, LadderPoint, ModelShape, StepInputs, StepOutput};
use crate::request::{
    Finish, FinishReason, GenerateRequest, Refusal, RequestId, RequestTimings, StopParams,
    TokenUpdate, Usage, ValidatedRequest,
};
use crate::sampling::{Sampled, Sampler};
pub use tlaloc_artifact::LadderError;

/// The model's shape cannot be scheduled.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    /// The ladder is malformed.
    #[error(transparent)]
    Ladder(#[from] LadderError),
    /// The pool shape.
    #[error(transparent)]
    Pool(#[from] BlockPoolError),
}

/// A step the ladder cannot hold; the sequences it concerned were ended.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{error}")]
pub struct Unschedulable {
    /// Why.
    pub error: LadderError,
    /// The sequences ended because of it (their pages are free).
    pub ended: Vec<(RequestId, Finish)>,
}

#[derive(Debug)]
struct Sequence {
    id: RequestId,
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    pages: Vec<PageId>,
    sampler: Sampler,
    stop: StopParams,
    ignore_eos: bool,
    max_tokens: usize,
    logprobs: Option<usize>,
    arrived: Instant,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    preemptions: u32,
}

impl Sequence {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn remaining(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Tokens it may still generate.
    fn budget_left(&self) -> usize {
        self.max_tokens.saturating_sub(self.output_len())
    }

    /// The pool slot of the token at `pos`: its page's first slot plus the offset in the page.
    fn slot(&self, pos: usize, block_size: usize) -> i32 {
        let page = self.pages[pos / block_size] as usize;
        (page * block_size + pos % block_size) as i32
    }

    fn finish(&self, reason: FinishReason) -> Finish {
        let now = Instant::now();
        Finish {
            reason,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: self.output_len(),
            },
            timings: RequestTimings {
                queued: self.first_scheduled.unwrap_or(now) - self.arrived,
                time_to_first_token: self.first_token.map(|t| t - self.arrived),
                total: now - self.arrived,
                preemptions: self.preemptions,
            },
        }
    }
}

/// One row of a scheduled step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// The request in this row.
    pub id: RequestId,
    /// Tokens the row processes.
    pub tokens: usize,
    /// Whether the row's output is a new token (the row reaches the end of its list).
    pub emits: bool,
}

/// The next step to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledStep {
    /// The entry to run.
    pub entry: LadderPoint,
    /// Its inputs.
    pub inputs: StepInputs,
    /// The live rows, in row order (rows past them are padding).
    pub rows: Vec<RowPlan>,
    /// Decode steps chained after this one ([`ModelExecutor::decode_chain`]): step `k`'s
    /// inputs for the same rows, each row one token further on. Their token ids are the
    /// previous step's next tokens, known only on the device; a row whose token budget ends
    /// earlier writes nothing there (slot -1), and its extra tokens are dropped. Empty unless
    /// every row decodes greedily without logprobs.
    ///
    /// [`ModelExecutor::decode_chain`]: crate::ModelExecutor::decode_chain
    pub chain: Vec<StepInputs>,
}

/// The step's output did not fit the step.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OutputError {
    /// Fewer next tokens than rows, or logits missing when asked for.
    #[error("step output for entry {entry} is malformed: {what}")]
    Malformed { entry: LadderPoint, what: String },
}

/// Counts for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerCounts {
    /// Sequences admitted (prefilling or decoding).
    pub running: usize,
    /// Sequences in the queue.
    pub waiting: usize,
    /// K/V pages held.
    pub pages_used: usize,
    /// K/V pages that can be held (all but the scratch page).
    pub pages_total: usize,
    /// Preemptions so far.
    pub preemptions: u64,
}

/// The continuous-batching scheduler: queue, running set, page pool, sampling of outputs.
#[derive(Debug)]
pub struct Scheduler {
    shape: ModelShape,
    ladder: Ladder,
    pool: BlockManager,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    last_was_prefill: bool,
    preemptions: u64,
    max_decode_chain: usize,
    /// Per decode entry: steps observed, and the wall time of one step (an exponential average
    /// that leaves out the first step, which can carry one-time work of a first execution).
    decode_costs: HashMap<LadderPoint, (u32, Duration)>,
    explore_decode: bool,
}

/// How many decode batch buckets, from the smallest that holds the rows up, are tried (each for
/// two steps) before the fastest measured is used. Two: the next bucket up is the one a plugin
/// most often compiles better (a one-row matmul as a matrix-vector loop, two rows as a
/// multithreaded GEMM), and every bucket tried costs its first execution (0.4-0.6 s on a CPU).
pub const DECODE_BUCKETS_TRIED: usize = 2;

/// Decode steps the smallest bucket runs before a larger one is tried.
pub const DECODE_STEPS_BEFORE_TRYING: u32 = 16;

impl Scheduler {
    /// A scheduler over a model's ladder and pool.
    pub fn new(shape: &ModelShape) -> Result<Self, ShapeError> {
        shape.ladder.validate()?;
        Ok(Self {
            shape: shape.clone(),
            ladder: shape.ladder.clone(),
            pool: BlockManager::new(shape.num_blocks, shape.block_size)?,
            vocab_size: shape.vocab_size,
            eos_token_ids: shape.eos_token_ids.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            last_was_prefill: false,
            preemptions: 0,
            max_decode_chain: 1,
            decode_costs: HashMap::new(),
            explore_decode: true,
        })
    }

    /// The most decode steps a scheduled step may chain (1, the default, chains none). The
    /// engine sets it from the executor's limit and the measured step time.
    pub fn set_max_decode_chain(&mut self, steps: usize) {
        self.max_decode_chain = steps.max(1);
    }

    /// Whether decode may try batch buckets larger than the smallest that fits (on by default;
    /// the engine turns it off when trying one would compile it first).
    pub fn set_decode_exploration(&mut self, on: bool) {
        self.explore_decode = on;
    }

    /// Records the wall time of one step of the decode entry `entry`.
    pub fn observe_decode_cost(&mut self, entry: LadderPoint, per_step: Duration) {
        let (seen, cost) = self.decode_costs.entry(entry).or_insert((0, per_step));
        *cost = match *seen {
            0 | 1 => per_step,
            _ => (*cost * 3 + per_step) / 4,
        };
        *seen = seen.saturating_add(1);
    }

    /// The decode entry for `rows` rows and `context` tokens: among the smallest batch bucket
    /// that holds the rows and the next [`DECODE_BUCKETS_TRIED`]` - 1` up, all at the smallest
    /// context bucket that fits: the smallest until it has run [`DECODE_STEPS_BEFORE_TRYING`]
    /// steps, then the first not yet measured (two steps: the first is left out), else the
    /// fastest.
    pub fn decode_entry(&self, rows: usize, context: usize) -> Result<LadderPoint, LadderError> {
        let smallest = self.ladder.decode_entry(rows, context)?;
        if !self.explore_decode {
            return Ok(smallest);
        }
        let seen = |e: &LadderPoint| self.decode_costs.get(e).map_or(0, |&(seen, _)| seen);
        // The smallest runs a while first, so that a short generation never pays for trying
        // another bucket.
        if seen(&smallest) < DECODE_STEPS_BEFORE_TRYING {
            return Ok(smallest);
        }
        let candidates: Vec<LadderPoint> = self
            .ladder
            .decode_points_from(smallest)
            .take(DECODE_BUCKETS_TRIED)
            .collect();
        let measured = |e: &LadderPoint| match self.decode_costs.get(e) {
            Some(&(seen, cost)) if seen >= 2 => Some(cost),
            _ => None,
        };
        if let Some(unmeasured) = candidates.iter().find(|e| measured(e).is_none()) {
            return Ok(*unmeasured);
        }
        Ok(candidates
            .into_iter()
            .min_by_key(|e| (measured(e), e.batch))
            .unwrap_or(smallest))
    }

    /// The ladder.
    pub fn ladder(&self) -> &Ladder {
        &self.ladder
    }

    /// Validates a request against this scheduler's model and queues it.
    pub fn add(&mut self, id: RequestId, request: GenerateRequest) -> Result<(), Refusal> {
        let request = request.validate(&self.shape)?;
        self.add_arrived(id, request, Instant::now());
        Ok(())
    }

    /// Queues a validated request that arrived at `arrived` (for accurate queue timings).
    pub fn add_arrived(&mut self, id: RequestId, request: ValidatedRequest, arrived: Instant) {
        let (request, max_tokens) = request.into_parts();
        let sampler = Sampler::new(request.sampling, &request.prompt_ids);
        self.waiting.push_back(Sequence {
            id,
            prompt_len: request.prompt_ids.len(),
            tokens: request.prompt_ids,
            computed: 0,
            pages: Vec::new(),
            sampler,
            stop: request.stop,
            ignore_eos: request.ignore_eos,
            max_tokens,
            logprobs: request.logprobs,
            arrived,
            first_scheduled: None,
            first_token: None,
            preemptions: 0,
        });
    }

    /// Ends a request wherever it is, freeing its pages at once; `None` if it is not here.
    pub fn abort(&mut self, id: RequestId) -> Option<Finish> {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i).expect("index found above")
        };
        Some(self.retire(seq, FinishReason::Abort))
    }

    /// Ends every request (after a failed step), freeing all pages.
    pub fn abort_all(&mut self) -> Vec<(RequestId, Finish)> {
        let all: Vec<Sequence> = self
            .running
            .drain(..)
            .chain(self.waiting.drain(..))
            .collect();
        all.into_iter()
            .map(|seq| (seq.id, self.retire(seq, FinishReason::Abort)))
            .collect()
    }

    /// Whether anything is queued or running.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Counts for metrics.
    pub fn counts(&self) -> SchedulerCounts {
        SchedulerCounts {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pages_used: self.pool.used(),
            pages_total: self.pool.allocatable(),
            preemptions: self.preemptions,
        }
    }

    /// Chooses and builds the next step; `None` when there is nothing to run. A step that the
    /// ladder cannot hold ends the sequences concerned (returned with the error).
    pub fn schedule(&mut self) -> Result<Option<ScheduledStep>, Unschedulable> {
        self.admit();
        let has_prefill = self.running.iter().any(|s| s.remaining() > 1);
        let has_decode = self.running.iter().any(|s| s.remaining() == 1);
        let step = if has_prefill && (!self.last_was_prefill || !has_decode) {
            self.last_was_prefill = true;
            self.schedule_prefill()
        } else if has_decode {
            self.last_was_prefill = false;
            // A chain would hold back the prompts waiting for prefill: chain only without them.
            let chain_limit = if has_prefill || !self.waiting.is_empty() {
                1
            } else {
                self.max_decode_chain
            };
            self.schedule_decode(chain_limit)
        } else {
            return Ok(None);
        };
        match step {
            Ok(Some(step)) => {
                let now = Instant::now();
                for row in &step.rows {
                    if let Some(seq) = self.running.iter_mut().find(|s| s.id == row.id) {
                        seq.first_scheduled.get_or_insert(now);
                    }
                }
                Ok(Some(step))
            }
            // Everything the step wanted was preempted; the queue will try again.
            Ok(None) => Ok(None),
            Err((err, ids)) => {
                let ended = ids
                    .into_iter()
                    .filter_map(|id| self.abort(id).map(|f| (id, f)))
                    .collect();
                Err(Unschedulable { error: err, ended })
            }
        }
    }

    fn admit(&mut self) {
        let outstanding: usize = self
            .running
            .iter()
            .map(|s| {
                self.pool
                    .pages_for(s.tokens.len())
                    .saturating_sub(s.pages.len())
            })
            .sum();
        let mut free = self.pool.free_count().saturating_sub(outstanding);
        while self.running.len() < self.ladder.max_decode_batch() {
            let Some(next) = self.waiting.front() else {
                break;
            };
            let need = self.pool.pages_for(next.tokens.len());
            if need > free {
                break;
            }
            free -= need;
            let seq = self.waiting.pop_front().expect("front checked");
            self.running.push(seq);
        }
    }

    /// Frees the youngest running sequence's pages and queues it first; returns its id.
    fn preempt_youngest(&mut self) -> Option<RequestId> {
        let mut seq = self.running.pop()?;
        self.pool.release(&mut seq.pages);
        seq.computed = 0;
        seq.preemptions += 1;
        self.preemptions += 1;
        tracing::debug!(
            id = seq.id,
            tokens = seq.tokens.len(),
            "preempted for recompute"
        );
        let id = seq.id;
        self.waiting.push_front(seq);
        Some(id)
    }

    /// Grows the pages of running sequence `id` to hold `tokens`, preempting the youngest
    /// others as needed; `false` if `id` itself had to be preempted.
    fn reserve(&mut self, id: RequestId, tokens: usize) -> bool {
        loop {
            let i = self
                .running
                .iter()
                .position(|s| s.id == id)
                .expect("running");
            let seq = &mut self.running[i];
            if self.pool.grow_to(&mut seq.pages, tokens) {
                return true;
            }
            if self.preempt_youngest() == Some(id) {
                return false;
            }
        }
    }

    fn schedule_decode(
        &mut self,
        chain_limit: usize,
    ) -> Result<Option<ScheduledStep>, (LadderError, Vec<RequestId>)> {
        let candidates: Vec<RequestId> = self
            .running
            .iter()
            .filter(|s| s.remaining() == 1)
            .map(|s| s.id)
            .take(self.ladder.max_decode_batch())
            .collect();
        let mut rows = Vec::new();
        for id in candidates {
            let Some(seq) = self.running.iter().find(|s| s.id == id) else {
                continue; // preempted to make room for an older one
            };
            let len = seq.tokens.len();
            if self.reserve(id, len) {
                rows.push(id);
            }
        }
        rows.retain(|id| self.running.iter().any(|s| s.id == *id));
        if rows.is_empty() {
            return Ok(None);
        }
        let context = rows
            .iter()
            .map(|id| self.seq(*id).tokens.len())
            .max()
            .expect("non-empty");
        let entry = self
            .decode_entry(rows.len(), context)
            .map_err(|e| (e, rows.clone()))?;
        let chain = self.chain_length(&rows, entry, chain_limit);
        let plans: Vec<RowPlan> = rows
            .iter()
            .map(|&id| RowPlan {
                id,
                tokens: 1,
                emits: true,
            })
            .collect();
        let mut step = self.build(entry, plans);
        step.chain = self.build_chain(&step, chain);
        Ok(Some(step))
    }

    /// How many decode steps (at most `limit`) the rows can run back to back (1 = no chain):
    /// every row must take
    /// the in-graph argmax without logprobs (its next token is then known on the device), the
    /// chain stays inside the entry's context bucket, runs no longer than the longest row's
    /// remaining token budget, and takes its extra pages from free pages only (a chain never
    /// preempts anyone).
    fn chain_length(&mut self, rows: &[RequestId], entry: LadderPoint, limit: usize) -> usize {
        if limit <= 1 {
            return 1;
        }
        let greedy = rows.iter().all(|id| {
            let s = self.seq(*id);
            s.sampler.params().uses_in_graph_argmax() && s.logprobs.is_none()
        });
        if !greedy {
            return 1;
        }
        let budget = |s: &Sequence| s.budget_left().max(1);
        let longest = rows.iter().map(|id| budget(self.seq(*id))).max();
        let max_len = rows.iter().map(|id| self.seq(*id).tokens.len()).max();
        let (Some(longest), Some(max_len)) = (longest, max_len) else {
            return 1;
        };
        let chain = limit
            .min(longest)
            .min((entry.context + 1).saturating_sub(max_len))
            .max(1);
        for id in rows {
            let i = self.running.iter().position(|s| s.id == *id);
            let Some(seq) = i.map(|i| &mut self.running[i]) else {
                return 1;
            };
            let last = seq.tokens.len() - 1 + budget(seq).min(chain) - 1;
            if !self.pool.grow_to(&mut seq.pages, last + 1) {
                return 1;
            }
        }
        chain
    }

    /// The inputs of the chained steps 1..`chain` after the decode step `step`.
    fn build_chain(&self, step: &ScheduledStep, chain: usize) -> Vec<StepInputs> {
        let bs = self.pool.block_size();
        let mut chained = Vec::with_capacity(chain.saturating_sub(1));
        let mut inputs = step.inputs.clone();
        for k in 1..chain {
            for (r, plan) in step.rows.iter().enumerate() {
                let seq = self.seq(plan.id);
                inputs.token_ids[r] = 0;
                if k >= seq.budget_left() {
                    // Past this row's budget: compute, write nothing, drop the token.
                    inputs.slot_mapping[r] = -1;
                    continue;
                }
                let pos = seq.tokens.len() - 1 + k;
                inputs.positions[r] = pos as i32;
                inputs.seq_lens[r] = (pos + 1) as i32;
                inputs.slot_mapping[r] = seq.slot(pos, bs);
            }
            chained.push(inputs.clone());
        }
        chained
    }

    fn schedule_prefill(&mut self) -> Result<Option<ScheduledStep>, (LadderError, Vec<RequestId>)> {
        let mut ids: Vec<RequestId> = self
            .running
            .iter()
            .filter(|s| s.remaining() > 1)
            .map(|s| s.id)
            .take(self.ladder.max_prefill_batch())
            .collect();
        let first_remaining = self.seq(ids[0]).remaining();
        let chunk = self.ladder.chunk_for(first_remaining);
        loop {
            let context = ids
                .iter()
                .map(|id| {
                    let s = self.seq(*id);
                    s.computed + s.remaining().min(chunk)
                })
                .max()
                .expect("non-empty");
            match self.prefill_entry(ids.len(), chunk, context) {
                Ok(_) => break,
                Err(e) if ids.len() == 1 => return Err((e, ids)),
                Err(_) => {
                    ids.pop();
                }
            }
        }
        let mut plans = Vec::new();
        for id in ids {
            let Some(seq) = self.running.iter().find(|s| s.id == id) else {
                continue;
            };
            let tokens = seq.remaining().min(chunk);
            let end = seq.computed + tokens;
            let emits = end == seq.tokens.len();
            if self.reserve(id, end) {
                plans.push(RowPlan { id, tokens, emits });
            }
        }
        plans.retain(|p| self.running.iter().any(|s| s.id == p.id));
        if plans.is_empty() {
            return Ok(None);
        }
        let context = plans
            .iter()
            .map(|p| self.seq(p.id).computed + p.tokens)
            .max()
            .expect("non-empty");
        let entry = self
            .prefill_entry(plans.len(), chunk, context)
            .map_err(|e| (e, plans.iter().map(|p| p.id).collect()))?;
        Ok(Some(self.build(entry, plans)))
    }

    /// The prefill entry for `rows` rows of at most `chunk` tokens (a chunk the ladder has,
    /// from [`Ladder::chunk_for`]) whose longest ends at `context`. A row of fewer tokens than
    /// the chunk rounds up to that same chunk: the chunk is the smallest that holds them.
    fn prefill_entry(
        &self,
        rows: usize,
        chunk: usize,
        context: usize,
    ) -> Result<LadderPoint, LadderError> {
        if rows > self.ladder.max_prefill_batch() {
            return Err(LadderError::BatchTooLarge {
                requested: rows,
                max: self.ladder.max_prefill_batch(),
            });
        }
        // A chunk's real tokens never outnumber the context they end at.
        self.ladder.prefill_entry(chunk.min(context), context)
    }

    fn seq(&self, id: RequestId) -> &Sequence {
        self.running.iter().find(|s| s.id == id).expect("running")
    }

    /// Lays out the inputs of `entry` for `rows`; rows past them follow the padding contract.
    fn build(&self, entry: LadderPoint, rows: Vec<RowPlan>) -> ScheduledStep {
        let t = entry.tokens;
        let bs = self.pool.block_size();
        let cols = self.ladder.blocks_per_sequence(entry.context);
        let mut inputs = StepInputs::padded(entry, bs);
        for (r, plan) in rows.iter().enumerate() {
            let seq = self.seq(plan.id);
            for (j, &page) in seq.pages.iter().take(cols).enumerate() {
                inputs.block_tables[r * cols + j] = page as i32;
            }
            for k in 0..plan.tokens {
                let pos = seq.computed + k;
                inputs.token_ids[r * t + k] = seq.tokens[pos] as i32;
                inputs.positions[r * t + k] = pos as i32;
                inputs.slot_mapping[r * t + k] = seq.slot(pos, bs);
            }
            inputs.seq_lens[r] = (seq.computed + plan.tokens) as i32;
            if plan.emits
                && (!seq.sampler.params().uses_in_graph_argmax() || seq.logprobs.is_some())
            {
                inputs.want_logits = true;
            }
        }
        ScheduledStep {
            entry,
            inputs,
            rows,
            chain: Vec::new(),
        }
    }

    /// Takes a step's output: advances every row, samples the new tokens, ends the sequences
    /// that stop (freeing their pages) and returns one update per new token.
    pub fn complete(
        &mut self,
        step: &ScheduledStep,
        output: &StepOutput,
    ) -> Result<Vec<TokenUpdate>, OutputError> {
        let malformed = |what: String| OutputError::Malformed {
            entry: step.entry,
            what,
        };
        if output.next_tokens.len() < step.rows.len() {
            return Err(malformed(format!(
                "{} next tokens for {} rows",
                output.next_tokens.len(),
                step.rows.len()
            )));
        }
        let logits = match (&output.logits, step.inputs.want_logits) {
            (Some(l), true) if l.len() == step.entry.batch * self.vocab_size => Some(l.as_slice()),
            (Some(l), true) => {
                return Err(malformed(format!(
                    "{} logits, expected {} rows x {} vocab",
                    l.len(),
                    step.entry.batch,
                    self.vocab_size
                )));
            }
            (None, true) => return Err(malformed("logits asked for but not returned".into())),
            (_, false) => None,
        };
        let now = Instant::now();
        let mut updates = Vec::new();
        let mut ended = Vec::new();
        for (r, plan) in step.rows.iter().enumerate() {
            let Some(i) = self.running.iter().position(|s| s.id == plan.id) else {
                continue;
            };
            let vocab = self.vocab_size;
            let seq = &mut self.running[i];
            seq.computed += plan.tokens;
            if !plan.emits {
                continue;
            }
            let row_logits = logits.map(|l| &l[r * vocab..(r + 1) * vocab]);
            let in_graph = output.next_tokens[r];
            let sampled = match row_logits {
                Some(row) if !seq.sampler.params().uses_in_graph_argmax() => {
                    seq.sampler.sample(row, seq.logprobs)
                }
                Some(row) => {
                    seq.sampler
                        .logprobs_of(row, in_graph as u32, seq.logprobs.unwrap_or(0))
                }
                None => Sampled {
                    token: in_graph as u32,
                    logprob: None,
                    top_logprobs: Vec::new(),
                },
            };
            if sampled.token as usize >= vocab {
                return Err(malformed(format!(
                    "row {r} produced token {} outside the vocabulary of {vocab}",
                    sampled.token
                )));
            }
            seq.tokens.push(sampled.token);
            seq.sampler.observe(sampled.token);
            seq.first_token.get_or_insert(now);
            let token = sampled.token;
            let reason = if seq.stop.stop_token_ids.contains(&token)
                || (!seq.ignore_eos && self.eos_token_ids.contains(&token))
            {
                Some(FinishReason::Stop)
            } else if seq.output_len() >= seq.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                ended.push((updates.len(), plan.id, reason));
            }
            updates.push(TokenUpdate {
                id: plan.id,
                sampled,
                finish: None,
            });
        }
        for (u, id, reason) in ended {
            let i = self
                .running
                .iter()
                .position(|s| s.id == id)
                .expect("running");
            let seq = self.running.remove(i);
            updates[u].finish = Some(self.retire(seq, reason));
        }
        Ok(updates)
    }

    fn retire(&mut self, mut seq: Sequence, reason: FinishReason) -> Finish {
        self.pool.release(&mut seq.pages);
        seq.finish(reason)
    }
}
