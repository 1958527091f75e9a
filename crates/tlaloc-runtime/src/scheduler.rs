//! Continuous batching: which sequences run in the next step, on which entry — the queue,
//! admission, preemption, and taking a step's output. Input arrays are laid out by
//! [`crate::layout`], the decode bucket is chosen by [`crate::bucket`], stops are decided by
//! [`crate::stop`]; requests arrive validated ([`crate::request`]).
//!
//! Every sequence is a token list and a count of tokens whose K/V is already in the pools
//! (`computed`). A step processes, for each of its rows, the tokens from `computed` on; when a
//! row reaches the end of its list, the step's output for that row is a new token. A prompt is
//! thus prefilled in chunks of the ladder's prefill sizes (each chunk continuing the earlier
//! one: positions and slots go on from `computed`), and a sequence with exactly one token left
//! is decoded. Preemption by recompute is then only `computed = 0`: the generated tokens are
//! already in the list, so the sequence is prefilled again over prompt + output. A parked
//! sequence ([`crate::request::SequenceControl`]) is one kept, pages and all, between requests;
//! evicting it is the same `computed = 0`.
//!
//! Policy: steps alternate between one prefill step and one decode step (every decoding
//! sequence in one call, on the smallest context bucket that holds the longest row), so that a
//! stream of new prompts cannot starve running decodes. A prefill step packs the oldest
//! sequences with prompt tokens left into one entry of `B` rows of `T` tokens: `T` is the chunk
//! the oldest of them needs (the smallest that holds its rest, else the largest), every other
//! row takes up to `T` tokens of its own rest (a shorter rest is padded, a longer one continues
//! in a later step), and `B` is as many as the largest prefill batch bucket holds, both bounded
//! by the per-step token budget ([`Scheduler::set_max_prefill_tokens`]): the entry's `B x T`,
//! padding included, since a padded token costs what a real one does in a rectangular entry.
//! A step always makes progress: the smallest prefill entry runs even when it alone is over the
//! budget.
//!
//! Prefill and decode are mixed by alternating steps, not by a mixed entry that carries decode
//! rows as one-token rows of a prefill entry: in an entry of `T` tokens per row a decode row
//! costs `T` tokens, so a mixed step of `b` decode rows beside a prompt chunk costs `b x T`
//! more than the prompt alone, where the separate decode step costs `b` tokens (and runs on
//! the decode entries the engine has measured); alternating bounds a running stream's wait
//! between tokens by one decode step plus one prefill step, and the token budget bounds that
//! prefill step (docs/benchmarks.md measures it). A waiting sequence is admitted when the
//! pages its tokens need are free (counting what admitted, not yet prefilled sequences still
//! need, and the pages parked sequences can give back) and the running set is under the largest
//! decode batch. When a sequence needs a page and none is free, the oldest parked sequence is
//! evicted, else the youngest running sequence is preempted: its pages freed at once, itself
//! put back at the head of the queue.
//!
//! Automatic prefix caching ([`crate::prefix_cache`], on with [`Scheduler::set_prefix_cache`]):
//! every full block a sequence computes is registered in the pool under its chained hash, as
//! soon as its K/V is in the pools, so a sequence still running shares its prefix too. A
//! sequence about to be prefilled from its start (new, preempted, or a parked one that was
//! evicted) first takes the longest cached run of its blocks, shared (reference-counted), and
//! is prefilled from the first uncached position; the block holding its last token is always
//! computed, so that its step returns that token's logits and no shared page is ever written.
//! A sequence whose first uncached block another running sequence is about to compute (prompts
//! with one system prompt arriving together) sits out the prefill steps until that block is
//! registered, so that prompts prefilled together compute a shared prefix once.
//! A parked sequence keeps its pages as before; its full blocks are registered like any
//! other's, so another request with the same history shares them while it is parked, and once
//! it is evicted its cached blocks stay in the pool's eviction order, so resuming it may find
//! them still there. A page is counted free when nobody holds it, cached or not; allocating
//! evicts the least recently released cached page only when no plain free page is left, and
//! before a parked sequence is evicted or a running one preempted.
//!
//! Sequences live in slots; the running set, the queue, the parked set and every step's rows
//! name slots, so nothing is found by scanning request ids (only an abort, which arrives by id,
//! goes through the id index).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::block_manager::{BlockManager, BlockPoolError, PageId};
use crate::bucket::DecodeBuckets;
use crate::constraint::{Constraint, TokenMask};
use crate::executor::{Ladder, LadderPoint, ModelShape, StepInputs, StepOutput};
use crate::layout::{self, ChainRow, RowInput};
use crate::prefix_cache::{BlockHash, PrefixCacheStats, extend_hashes};
use crate::request::{
    Finish, FinishReason, GenerateRequest, Refusal, RequestId, RequestTimings, SequenceKey,
    StopParams, TokenUpdate, Usage, ValidatedRequest,
};
use crate::sampling::{Sampled, Sampler};
use crate::stop::StopRule;
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

/// One row of a scheduled step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// The request in this row.
    pub id: RequestId,
    /// Where its sequence lives.
    slot: Slot,
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
    /// every row decodes greedily without logprobs, bias or a token constraint.
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
    /// Sequences parked between requests.
    pub parked: usize,
    /// K/V pages held.
    pub pages_used: usize,
    /// K/V pages that can be held (all but the scratch page).
    pub pages_total: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// K/V pages holding a cached prefix block (held or evictable).
    pub pages_cached: usize,
    /// Prefix cache lookups and hits so far.
    pub prefix_cache: PrefixCacheStats,
}

/// Where a sequence lives in the scheduler's slot table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Slot(usize);

#[derive(Debug)]
struct Sequence {
    id: RequestId,
    tokens: Vec<u32>,
    /// Tokens before this request's output: a continued sequence's history, then the prompt.
    prompt_len: usize,
    /// This request's prompt as submitted (what its usage reports).
    submitted_prompt: usize,
    computed: usize,
    pages: Vec<PageId>,
    /// Chained hashes of full blocks of `tokens` (empty with the prefix cache off).
    block_hashes: Vec<BlockHash>,
    /// Leading pages registered in (or taken from) the prefix cache.
    registered: usize,
    /// Whether the prefix cache was asked for this sequence since its K/V was last dropped.
    prefix_checked: bool,
    /// Whether it is in the running set (else it waits in the queue).
    running: bool,
    sampler: Sampler,
    stop: StopParams,
    ignore_eos: bool,
    max_tokens: usize,
    logprobs: Option<usize>,
    /// The tokens it may generate, when constrained.
    constraint: Option<Constraint>,
    /// The longer-lived sequence it belongs to, and whether to park it at the end.
    parks_as: Option<(SequenceKey, bool)>,
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

    fn finish(&self, reason: FinishReason) -> Finish {
        let now = Instant::now();
        Finish {
            reason,
            usage: Usage {
                prompt_tokens: self.submitted_prompt,
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

/// A sequence kept between requests: its tokens, and the pages holding the K/V of the first
/// `computed` of them (none once evicted).
#[derive(Debug)]
struct Parked {
    tokens: Vec<u32>,
    computed: usize,
    pages: Vec<PageId>,
    block_hashes: Vec<BlockHash>,
    registered: usize,
}

/// The continuous-batching scheduler: queue, running set, parked sequences, page pool, sampling
/// of outputs.
#[derive(Debug)]
pub struct Scheduler {
    shape: ModelShape,
    pool: BlockManager,
    slots: Vec<Option<Sequence>>,
    free_slots: Vec<usize>,
    by_id: HashMap<RequestId, Slot>,
    waiting: VecDeque<Slot>,
    /// In admission order: the last is the youngest, preempted first.
    running: Vec<Slot>,
    parked: HashMap<SequenceKey, Parked>,
    /// Parked keys, oldest first: the order of eviction.
    parked_order: VecDeque<SequenceKey>,
    /// Keys of sequences a live request is using.
    busy: HashSet<SequenceKey>,
    last_was_prefill: bool,
    preemptions: u64,
    max_decode_chain: usize,
    buckets: DecodeBuckets,
    /// The root of the prefix cache's hash chains; `None` turns the cache off.
    prefix_root: Option<BlockHash>,
    prefix_stats: PrefixCacheStats,
    /// The most tokens (entry batch x chunk) one prefill step computes.
    max_prefill_tokens: usize,
    /// Sequences that sit out this step's prefill, waiting for a block another computes.
    deferred: HashSet<Slot>,
}

/// The default per-step prefill token budget: four of the default 128-token chunks, so that a
/// prefill step packs a few prompts while a running stream waits for at most one such step
/// between its tokens.
pub const DEFAULT_MAX_PREFILL_TOKENS: usize = 512;

impl Scheduler {
    /// A scheduler over a model's ladder and pool.
    pub fn new(shape: &ModelShape) -> Result<Self, ShapeError> {
        shape.ladder.validate()?;
        Ok(Self {
            pool: BlockManager::new(shape.num_blocks, shape.block_size)?,
            shape: shape.clone(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_id: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: HashMap::new(),
            parked_order: VecDeque::new(),
            busy: HashSet::new(),
            last_was_prefill: false,
            preemptions: 0,
            max_decode_chain: 1,
            buckets: DecodeBuckets::default(),
            prefix_root: None,
            prefix_stats: PrefixCacheStats::default(),
            max_prefill_tokens: DEFAULT_MAX_PREFILL_TOKENS,
            deferred: HashSet::new(),
        })
    }

    /// Bounds the tokens one prefill step computes: its entry's batch times its chunk, padding
    /// included (default [`DEFAULT_MAX_PREFILL_TOKENS`]). The smallest prefill entry runs even
    /// when it alone is over the budget, so that prompts always make progress.
    pub fn set_max_prefill_tokens(&mut self, tokens: usize) {
        self.max_prefill_tokens = tokens.max(1);
    }

    /// The per-step prefill token budget.
    pub fn max_prefill_tokens(&self) -> usize {
        self.max_prefill_tokens
    }

    /// Turns automatic prefix caching on, for the model whose K/V is identified by `identity`
    /// (bytes that change whenever a token's K/V would: the artifact's manifest), or off with
    /// `None` (the default). Set it before the first request.
    pub fn set_prefix_cache(&mut self, identity: Option<&[u8]>) {
        self.prefix_root = identity.map(BlockHash::root);
    }

    /// The page pool (for inspection: holders, cached blocks).
    pub fn pool(&self) -> &BlockManager {
        &self.pool
    }

    /// The pages of request `id`'s sequence, in order; `None` if it is not here.
    pub fn pages_of(&self, id: RequestId) -> Option<&[PageId]> {
        let slot = self.by_id.get(&id)?;
        Some(&self.seq(*slot).pages)
    }

    /// The most decode steps a scheduled step may chain (1, the default, chains none). The
    /// engine sets it from the executor's limit and the measured step time.
    pub fn set_max_decode_chain(&mut self, steps: usize) {
        self.max_decode_chain = steps.max(1);
    }

    /// Whether decode may try batch buckets larger than the smallest that fits (on by default;
    /// the engine turns it off when trying one would compile it first).
    pub fn set_decode_exploration(&mut self, on: bool) {
        self.buckets.set_exploration(on);
    }

    /// Records the wall time of one step of the decode entry `entry`.
    pub fn observe_decode_cost(&mut self, entry: LadderPoint, per_step: Duration) {
        self.buckets.observe(entry, per_step);
    }

    /// The decode entry for `rows` rows and `context` tokens, by measurement
    /// ([`DecodeBuckets::choose`]).
    pub fn decode_entry(&self, rows: usize, context: usize) -> Result<LadderPoint, LadderError> {
        self.buckets.choose(&self.shape.ladder, rows, context)
    }

    /// The ladder.
    pub fn ladder(&self) -> &Ladder {
        &self.shape.ladder
    }

    /// Validates a request against this scheduler's model and queues it.
    pub fn add(&mut self, id: RequestId, request: GenerateRequest) -> Result<(), Refusal> {
        let request = request.validate(&self.shape)?;
        self.add_arrived(id, request, Instant::now())
    }

    /// Queues a validated request that arrived at `arrived` (for accurate queue timings). A
    /// request that continues a parked sequence is checked here once more, against the
    /// sequence's length (refused, the sequence left parked as it was, if the whole no longer
    /// fits the top context bucket).
    pub fn add_arrived(
        &mut self,
        id: RequestId,
        request: ValidatedRequest,
        arrived: Instant,
    ) -> Result<(), Refusal> {
        let (request, mut max_tokens) = request.into_parts();
        let mut history = Parked {
            tokens: Vec::new(),
            computed: 0,
            pages: Vec::new(),
            block_hashes: Vec::new(),
            registered: 0,
        };
        if let Some(control) = request.sequence {
            if self.busy.contains(&control.key) {
                return Err(Refusal::SequenceBusy { key: control.key });
            }
            if let Some(parked) = self.unpark(control.key) {
                match request.budget_after(parked.tokens.len(), &self.shape) {
                    Ok(budget) => {
                        max_tokens = budget;
                        history = parked;
                    }
                    Err(refusal) => {
                        self.park(control.key, parked);
                        return Err(refusal);
                    }
                }
            }
            self.busy.insert(control.key);
        }
        let mut tokens = history.tokens;
        tokens.extend_from_slice(&request.prompt_ids);
        let mut block_hashes = history.block_hashes;
        if let Some(root) = &self.prefix_root {
            extend_hashes(root, &mut block_hashes, &tokens, self.pool.block_size());
        }
        let sampler = Sampler::new(request.sampling, &tokens);
        let slot = self.insert(Sequence {
            id,
            prompt_len: tokens.len(),
            submitted_prompt: request.prompt_ids.len(),
            tokens,
            computed: history.computed,
            pages: history.pages,
            block_hashes,
            registered: history.registered,
            prefix_checked: history.computed > 0,
            running: false,
            sampler,
            stop: request.stop,
            ignore_eos: request.ignore_eos,
            max_tokens,
            logprobs: request.logprobs,
            constraint: request.constraint,
            parks_as: request.sequence.map(|c| (c.key, c.park)),
            arrived,
            first_scheduled: None,
            first_token: None,
            preemptions: 0,
        });
        self.waiting.push_back(slot);
        Ok(())
    }

    /// Ends a request wherever it is, freeing its pages at once (an aborted request ends its
    /// sequence too); `None` if it is not here.
    pub fn abort(&mut self, id: RequestId) -> Option<Finish> {
        let slot = *self.by_id.get(&id)?;
        self.running.retain(|&s| s != slot);
        self.waiting.retain(|&s| s != slot);
        Some(self.retire(slot, FinishReason::Abort))
    }

    /// Ends every request (after a failed step), freeing all pages; parked sequences are dropped
    /// too (the pools' contents are unknown after a failed step).
    pub fn abort_all(&mut self) -> Vec<(RequestId, Finish)> {
        let all: Vec<Slot> = self
            .running
            .drain(..)
            .chain(self.waiting.drain(..))
            .collect();
        let ended = all
            .into_iter()
            .map(|slot| {
                let id = self.seq(slot).id;
                (id, self.retire(slot, FinishReason::Abort))
            })
            .collect();
        for key in std::mem::take(&mut self.parked_order) {
            self.release(key);
        }
        self.pool.forget_cached();
        ended
    }

    /// Ends the sequence parked under `key`, freeing its pages; `false` if none is parked there.
    pub fn release(&mut self, key: SequenceKey) -> bool {
        match self.unpark(key) {
            Some(mut parked) => {
                self.pool.release(&mut parked.pages);
                true
            }
            None => false,
        }
    }

    /// Whether anything is queued or running (parked sequences are not work).
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Counts for metrics.
    pub fn counts(&self) -> SchedulerCounts {
        SchedulerCounts {
            running: self.running.len(),
            waiting: self.waiting.len(),
            parked: self.parked.len(),
            pages_used: self.pool.used(),
            pages_total: self.pool.allocatable(),
            preemptions: self.preemptions,
            pages_cached: self.pool.cached(),
            prefix_cache: PrefixCacheStats {
                evictions: self.pool.evictions(),
                ..self.prefix_stats
            },
        }
    }

    /// Chooses and builds the next step; `None` when there is nothing to run. A step that the
    /// ladder cannot hold ends the sequences concerned (returned with the error).
    pub fn schedule(&mut self) -> Result<Option<ScheduledStep>, Unschedulable> {
        self.admit();
        self.attach_cached_prefixes();
        let has_prefill = self
            .running
            .iter()
            .any(|&s| self.seq(s).remaining() > 1 && !self.deferred.contains(&s));
        let has_decode = self.running.iter().any(|&s| self.seq(s).remaining() == 1);
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
                    self.seq_mut(row.slot).first_scheduled.get_or_insert(now);
                }
                Ok(Some(step))
            }
            // Everything the step wanted was preempted; the queue will try again.
            Ok(None) => Ok(None),
            Err((err, slots)) => {
                let ended = slots
                    .into_iter()
                    .map(|slot| {
                        let id = self.seq(slot).id;
                        self.running.retain(|&s| s != slot);
                        self.waiting.retain(|&s| s != slot);
                        (id, self.retire(slot, FinishReason::Abort))
                    })
                    .collect();
                Err(Unschedulable { error: err, ended })
            }
        }
    }

    fn seq(&self, slot: Slot) -> &Sequence {
        self.slots[slot.0].as_ref().expect("a live slot")
    }

    fn seq_mut(&mut self, slot: Slot) -> &mut Sequence {
        self.slots[slot.0].as_mut().expect("a live slot")
    }

    fn is_running(&self, slot: Slot) -> bool {
        self.slots[slot.0].as_ref().is_some_and(|s| s.running)
    }

    fn insert(&mut self, seq: Sequence) -> Slot {
        let id = seq.id;
        let slot = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i] = Some(seq);
                Slot(i)
            }
            None => {
                self.slots.push(Some(seq));
                Slot(self.slots.len() - 1)
            }
        };
        self.by_id.insert(id, slot);
        slot
    }

    /// Takes the sequence out of its slot (already out of the running set and the queue).
    fn take(&mut self, slot: Slot) -> Sequence {
        let seq = self.slots[slot.0].take().expect("a live slot");
        self.free_slots.push(slot.0);
        self.by_id.remove(&seq.id);
        if let Some((key, _)) = seq.parks_as {
            self.busy.remove(&key);
        }
        seq
    }

    fn park(&mut self, key: SequenceKey, parked: Parked) {
        self.parked.insert(key, parked);
        self.parked_order.push_back(key);
    }

    fn unpark(&mut self, key: SequenceKey) -> Option<Parked> {
        let parked = self.parked.remove(&key)?;
        self.parked_order.retain(|&k| k != key);
        Some(parked)
    }

    /// Frees the pages of the oldest parked sequence that holds any (it stays parked and is
    /// recomputed on resume); `false` if no parked sequence holds pages.
    fn evict_oldest_parked(&mut self) -> bool {
        let Some(&key) = self
            .parked_order
            .iter()
            .find(|k| self.parked.get(k).is_some_and(|p| !p.pages.is_empty()))
        else {
            return false;
        };
        let parked = self.parked.get_mut(&key).expect("listed");
        self.pool.release(&mut parked.pages);
        parked.computed = 0;
        parked.registered = 0;
        tracing::debug!(key, "parked sequence evicted for recompute");
        true
    }

    fn admit(&mut self) {
        let outstanding: usize = self
            .running
            .iter()
            .map(|&s| {
                let seq = self.seq(s);
                self.pool
                    .pages_for(seq.tokens.len())
                    .saturating_sub(seq.pages.len())
            })
            .sum();
        // Evicting a parked sequence frees only the pages nobody else holds.
        let parked_pages: usize = self
            .parked
            .values()
            .flat_map(|p| &p.pages)
            .filter(|&&page| self.pool.holders(page) == 1)
            .count();
        let mut free = (self.pool.free_count() + parked_pages).saturating_sub(outstanding);
        while self.running.len() < self.shape.ladder.max_decode_batch() {
            let Some(&next) = self.waiting.front() else {
                break;
            };
            let seq = self.seq(next);
            let need = self
                .pool
                .pages_for(seq.tokens.len())
                .saturating_sub(seq.pages.len() + self.held_cached_prefix(seq));
            if need > free {
                break;
            }
            free -= need;
            self.waiting.pop_front();
            self.seq_mut(next).running = true;
            self.running.push(next);
        }
    }

    /// Pages of `seq`'s prefix that a lookup would find held by others already (so admitting it
    /// takes none of the free ones for them); 0 once it was looked up, or with the cache off.
    fn held_cached_prefix(&self, seq: &Sequence) -> usize {
        if self.prefix_root.is_none() || seq.prefix_checked || seq.computed > 0 {
            return 0;
        }
        let usable = self.cacheable_blocks(seq);
        self.pool
            .lookup(&seq.block_hashes[..usable])
            .into_iter()
            .filter(|&page| self.pool.holders(page) > 0)
            .count()
    }

    /// How many leading blocks of `seq` a prefix hit may cover: full blocks before its last
    /// token (the last token is always computed: its logits are the step's output).
    fn cacheable_blocks(&self, seq: &Sequence) -> usize {
        ((seq.tokens.len() - 1) / self.pool.block_size()).min(seq.block_hashes.len())
    }

    /// Gives the sequences next in line for prefill (the oldest running ones with more than
    /// one token left, as many as a prefill step holds) the longest cached run of their
    /// blocks, once per time their K/V is dropped. A hit can leave a sequence with one token
    /// left, making it a decode row and bringing the next one in line, so this repeats until
    /// every sequence in line was looked up.
    ///
    /// A sequence whose first uncached block is one that another running sequence is about to
    /// compute (the same hash, not registered yet: prompts with the same system prompt that
    /// arrive together) is deferred instead: it sits out this step's prefill and is looked up
    /// again at the next, so that the block is computed once and then shared, as it is when
    /// prompts are prefilled one at a time.
    fn attach_cached_prefixes(&mut self) {
        self.deferred.clear();
        let Some(root) = self.prefix_root else {
            return;
        };
        let in_line = self.shape.ladder.max_prefill_batch();
        let block_size = self.pool.block_size();
        // Blocks that sequences already looked up will compute and register.
        let mut pending: HashSet<BlockHash> = self
            .running
            .iter()
            .map(|&s| self.seq(s))
            .filter(|s| s.prefix_checked)
            .flat_map(|s| s.block_hashes.get(s.registered..).unwrap_or_default())
            .copied()
            .collect();
        loop {
            let next = self
                .running
                .iter()
                .copied()
                .filter(|&s| self.seq(s).remaining() > 1 && !self.deferred.contains(&s))
                .take(in_line)
                .find(|&s| !self.seq(s).prefix_checked);
            let Some(slot) = next else {
                return;
            };
            let seq = self.slots[slot.0].as_mut().expect("a live slot");
            if seq.computed > 0 {
                seq.prefix_checked = true;
                continue; // a continued sequence with its K/V still in its pages
            }
            debug_assert!(seq.pages.is_empty(), "no K/V but pages held");
            // Preempted sequences have grown since their hashes were taken.
            extend_hashes(&root, &mut seq.block_hashes, &seq.tokens, block_size);
            let usable = ((seq.tokens.len() - 1) / block_size).min(seq.block_hashes.len());
            let pages = self.pool.lookup(&seq.block_hashes[..usable]);
            if seq.block_hashes[..usable]
                .get(pages.len())
                .is_some_and(|miss| pending.contains(miss))
            {
                self.deferred.insert(slot);
                continue;
            }
            seq.prefix_checked = true;
            pending.extend(seq.block_hashes.get(pages.len()..).unwrap_or_default());
            for &page in &pages {
                self.pool.acquire(page);
            }
            let stats = &mut self.prefix_stats;
            stats.queries += 1;
            stats.query_tokens += seq.tokens.len() as u64;
            if !pages.is_empty() {
                stats.hits += 1;
                stats.hit_tokens += (pages.len() * block_size) as u64;
                tracing::trace!(id = seq.id, blocks = pages.len(), "prefix cache hit");
            }
            seq.computed = pages.len() * block_size;
            seq.registered = pages.len();
            seq.pages = pages;
        }
    }

    /// Frees the youngest running sequence's pages and queues it first; returns its slot.
    fn preempt_youngest(&mut self) -> Option<Slot> {
        let slot = self.running.pop()?;
        let seq = self.slots[slot.0].as_mut().expect("a live slot");
        self.pool.release(&mut seq.pages);
        seq.computed = 0;
        seq.registered = 0;
        seq.prefix_checked = false;
        seq.running = false;
        seq.preemptions += 1;
        self.preemptions += 1;
        tracing::debug!(
            id = seq.id,
            tokens = seq.tokens.len(),
            "preempted for recompute"
        );
        self.waiting.push_front(slot);
        Some(slot)
    }

    /// Grows the pages of running sequence `slot` to hold `tokens`, evicting parked sequences
    /// and then preempting the youngest others as needed; `false` if `slot` itself had to be
    /// preempted.
    fn reserve(&mut self, slot: Slot, tokens: usize) -> bool {
        loop {
            let seq = self.slots[slot.0].as_mut().expect("a live slot");
            if self.pool.grow_to(&mut seq.pages, tokens) {
                return true;
            }
            if self.evict_oldest_parked() {
                continue;
            }
            if self.preempt_youngest() == Some(slot) {
                return false;
            }
        }
    }

    fn schedule_decode(
        &mut self,
        chain_limit: usize,
    ) -> Result<Option<ScheduledStep>, (LadderError, Vec<Slot>)> {
        let candidates: Vec<Slot> = self
            .running
            .iter()
            .copied()
            .filter(|&s| self.seq(s).remaining() == 1)
            .take(self.shape.ladder.max_decode_batch())
            .collect();
        let mut rows = Vec::new();
        for slot in candidates {
            if !self.is_running(slot) {
                continue; // preempted to make room for an older one
            }
            let len = self.seq(slot).tokens.len();
            if self.reserve(slot, len) {
                rows.push(slot);
            }
        }
        rows.retain(|&s| self.is_running(s));
        if rows.is_empty() {
            return Ok(None);
        }
        let context = rows
            .iter()
            .map(|&s| self.seq(s).tokens.len())
            .max()
            .expect("non-empty");
        let entry = self
            .decode_entry(rows.len(), context)
            .map_err(|e| (e, rows.clone()))?;
        let chain = self.chain_length(&rows, entry, chain_limit);
        let plans: Vec<RowPlan> = rows
            .iter()
            .map(|&slot| RowPlan {
                id: self.seq(slot).id,
                slot,
                tokens: 1,
                emits: true,
            })
            .collect();
        let mut step = self.build(entry, plans);
        step.chain = self.build_chain(&step, chain);
        Ok(Some(step))
    }

    /// How many decode steps (at most `limit`) the rows can run back to back (1 = no chain):
    /// every row must take the in-graph argmax without logprobs or a constraint (its next token is then known
    /// on the device), the chain stays inside the entry's context bucket, runs no longer than
    /// the longest row's remaining token budget, and takes its extra pages from free pages
    /// only (a chain never preempts anyone, nor evicts a parked sequence).
    fn chain_length(&mut self, rows: &[Slot], entry: LadderPoint, limit: usize) -> usize {
        if limit <= 1 {
            return 1;
        }
        let greedy = rows.iter().all(|&s| {
            let s = self.seq(s);
            s.sampler.params().uses_in_graph_argmax()
                && s.logprobs.is_none()
                && s.constraint.is_none()
        });
        if !greedy {
            return 1;
        }
        let budget = |s: &Sequence| s.budget_left().max(1);
        let longest = rows.iter().map(|&s| budget(self.seq(s))).max();
        let max_len = rows.iter().map(|&s| self.seq(s).tokens.len()).max();
        let (Some(longest), Some(max_len)) = (longest, max_len) else {
            return 1;
        };
        let chain = limit
            .min(longest)
            .min((entry.context + 1).saturating_sub(max_len))
            .max(1);
        for &slot in rows {
            let seq = self.slots[slot.0].as_mut().expect("a live slot");
            let last = seq.tokens.len() - 1 + budget(seq).min(chain) - 1;
            if !self.pool.grow_to(&mut seq.pages, last + 1) {
                return 1;
            }
        }
        chain
    }

    /// The inputs of the chained steps 1..`chain` after the decode step `step`.
    fn build_chain(&self, step: &ScheduledStep, chain: usize) -> Vec<StepInputs> {
        let rows: Vec<ChainRow<'_>> = step
            .rows
            .iter()
            .map(|plan| {
                let seq = self.seq(plan.slot);
                ChainRow {
                    position: seq.tokens.len() - 1,
                    budget: seq.budget_left(),
                    pages: &seq.pages,
                }
            })
            .collect();
        layout::chain_steps(&step.inputs, &rows, chain, self.pool.block_size())
    }

    fn schedule_prefill(&mut self) -> Result<Option<ScheduledStep>, (LadderError, Vec<Slot>)> {
        let candidates: Vec<Slot> = self
            .running
            .iter()
            .copied()
            .filter(|&s| self.seq(s).remaining() > 1 && !self.deferred.contains(&s))
            .take(self.shape.ladder.max_prefill_batch())
            .collect();
        let (rows, chunk) =
            self.prefill_shape(self.seq(candidates[0]).remaining(), candidates.len());
        let mut slots = candidates;
        slots.truncate(rows);
        loop {
            let context = slots
                .iter()
                .map(|&s| {
                    let s = self.seq(s);
                    s.computed + s.remaining().min(chunk)
                })
                .max()
                .expect("non-empty");
            match self.prefill_entry(slots.len(), chunk, context) {
                Ok(_) => break,
                Err(e) if slots.len() == 1 => return Err((e, slots)),
                Err(_) => {
                    slots.pop();
                }
            }
        }
        let mut plans = Vec::new();
        for slot in slots {
            if !self.is_running(slot) {
                continue;
            }
            let seq = self.seq(slot);
            let (id, tokens) = (seq.id, seq.remaining().min(chunk));
            let end = seq.computed + tokens;
            let emits = end == seq.tokens.len();
            if self.reserve(slot, end) {
                plans.push(RowPlan {
                    id,
                    slot,
                    tokens,
                    emits,
                });
            }
        }
        plans.retain(|p| self.is_running(p.slot));
        if plans.is_empty() {
            return Ok(None);
        }
        let context = plans
            .iter()
            .map(|p| self.seq(p.slot).computed + p.tokens)
            .max()
            .expect("non-empty");
        let entry = self
            .prefill_entry(plans.len(), chunk, context)
            .map_err(|e| (e, plans.iter().map(|p| p.slot).collect()))?;
        Ok(Some(self.build(entry, plans)))
    }

    /// The rows and chunk of a prefill step whose oldest row has `oldest_remaining` tokens
    /// left and for which `candidates` rows are in line: the chunk the oldest needs, the
    /// largest within the budget when that one is over it; then as many rows as the budget
    /// holds at that chunk, counting the batch bucket they round up to (at least one row of the
    /// smallest chunk, whatever the budget).
    fn prefill_shape(&self, oldest_remaining: usize, candidates: usize) -> (usize, usize) {
        let ladder = &self.shape.ladder;
        let budget = self.max_prefill_tokens;
        let smallest_batch = ladder.prefill_batch_for(1);
        let wanted = ladder.chunk_for(oldest_remaining);
        let chunk = if smallest_batch * wanted <= budget {
            wanted
        } else {
            ladder
                .prefill_chunks
                .iter()
                .copied()
                .rev()
                .find(|&c| smallest_batch * c <= budget)
                .unwrap_or_else(|| ladder.prefill_chunks[0])
        };
        let rows = (1..=candidates)
            .rev()
            .find(|&n| ladder.prefill_batch_for(n) * chunk <= budget)
            .unwrap_or(1);
        (rows, chunk)
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
        // A chunk's real tokens never outnumber the context they end at.
        self.shape
            .ladder
            .prefill_batch_entry(rows, chunk.min(context), context)
    }

    /// Lays out the inputs of `entry` for `rows`; rows past them are dead.
    fn build(&self, entry: LadderPoint, rows: Vec<RowPlan>) -> ScheduledStep {
        let inputs: Vec<RowInput<'_>> = rows
            .iter()
            .map(|plan| {
                let seq = self.seq(plan.slot);
                RowInput {
                    tokens: &seq.tokens[seq.computed..seq.computed + plan.tokens],
                    start: seq.computed,
                    pages: &seq.pages,
                }
            })
            .collect();
        let mut inputs = layout::lay_out(entry, self.pool.block_size(), &inputs)
            .expect("the scheduler's rows fit the entry it chose for them");
        inputs.want_logits = rows.iter().any(|plan| {
            let seq = self.seq(plan.slot);
            plan.emits
                && (!seq.sampler.params().uses_in_graph_argmax()
                    || seq.logprobs.is_some()
                    || seq.constraint.is_some())
        });
        ScheduledStep {
            entry,
            inputs,
            rows,
            chain: Vec::new(),
        }
    }

    /// Takes a step's output: advances every row, samples the new tokens, ends the sequences
    /// that stop (freeing their pages, or parking them) and returns one update per new token.
    pub fn complete(
        &mut self,
        step: &ScheduledStep,
        output: &StepOutput,
    ) -> Result<Vec<TokenUpdate>, OutputError> {
        let malformed = |what: String| OutputError::Malformed {
            entry: step.entry,
            what,
        };
        let vocab = self.shape.vocab_size;
        if output.next_tokens.len() < step.rows.len() {
            return Err(malformed(format!(
                "{} next tokens for {} rows",
                output.next_tokens.len(),
                step.rows.len()
            )));
        }
        let logits = match (&output.logits, step.inputs.want_logits) {
            (Some(l), true) if l.len() == step.entry.batch * vocab => Some(l.as_slice()),
            (Some(l), true) => {
                return Err(malformed(format!(
                    "{} logits, expected {} rows x {} vocab",
                    l.len(),
                    step.entry.batch,
                    vocab
                )));
            }
            (None, true) => return Err(malformed("logits asked for but not returned".into())),
            (_, false) => None,
        };
        let now = Instant::now();
        let mut updates = Vec::new();
        let mut ended = Vec::new();
        for (r, plan) in step.rows.iter().enumerate() {
            // A row whose sequence ended since the step was scheduled has nothing to advance.
            let Some(seq) = self.slots[plan.slot.0]
                .as_mut()
                .filter(|s| s.id == plan.id && s.running)
            else {
                continue;
            };
            seq.computed += plan.tokens;
            if let Some(root) = &self.prefix_root {
                register_blocks(&mut self.pool, root, seq);
            }
            if !plan.emits {
                continue;
            }
            let row_logits = logits.map(|l| &l[r * vocab..(r + 1) * vocab]);
            let in_graph = output.next_tokens[r];
            let mut constraint_ended = false;
            let sampled = match (row_logits, &seq.constraint) {
                (Some(row), Some(constraint)) => {
                    let mut constraint = constraint.lock();
                    let mask = match constraint.next_mask() {
                        Ok(mask) if !mask.is_empty_within(vocab) => mask,
                        // Nothing allowed (or the constraint failed): end on end-of-sequence.
                        outcome => {
                            if let Err(e) = outcome {
                                tracing::warn!(request = plan.id, "{e}; ending the request");
                            }
                            constraint_ended = true;
                            TokenMask::only(&self.shape.eos_token_ids)
                        }
                    };
                    let sampled = seq.sampler.sample_within(row, seq.logprobs, Some(&mask));
                    if !constraint_ended {
                        if let Err(e) = constraint.commit(sampled.token) {
                            tracing::warn!(request = plan.id, "{e}; ending the request");
                            constraint_ended = true;
                        }
                        constraint_ended |= constraint.is_finished();
                    }
                    sampled
                }
                (Some(row), None) if !seq.sampler.params().uses_in_graph_argmax() => {
                    seq.sampler.sample(row, seq.logprobs)
                }
                (Some(row), None) => {
                    seq.sampler
                        .logprobs_of(row, in_graph as u32, seq.logprobs.unwrap_or(0))
                }
                (None, _) => Sampled {
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
            let rule = StopRule {
                stop: &seq.stop,
                eos_token_ids: &self.shape.eos_token_ids,
                ignore_eos: seq.ignore_eos,
                max_tokens: seq.max_tokens,
            };
            let reason = rule
                .after(sampled.token, seq.output_len())
                .or(constraint_ended.then_some(FinishReason::Stop));
            if let Some(reason) = reason {
                ended.push((updates.len(), plan.slot, reason));
            }
            updates.push(TokenUpdate {
                id: plan.id,
                sampled,
                finish: None,
            });
        }
        for (u, slot, reason) in ended {
            self.running.retain(|&s| s != slot);
            updates[u].finish = Some(self.retire(slot, reason));
        }
        Ok(updates)
    }

    /// Ends the sequence in `slot` (already out of the running set and the queue): parks it
    /// when its request asked to and did not abort, else frees its pages.
    fn retire(&mut self, slot: Slot, reason: FinishReason) -> Finish {
        let mut seq = self.take(slot);
        let finish = seq.finish(reason);
        match seq.parks_as {
            Some((key, true)) if reason != FinishReason::Abort => self.park(
                key,
                Parked {
                    tokens: seq.tokens,
                    computed: seq.computed,
                    pages: seq.pages,
                    block_hashes: seq.block_hashes,
                    registered: seq.registered,
                },
            ),
            _ => self.pool.release(&mut seq.pages),
        }
        finish
    }
}

/// Registers in the pool every full block of `seq` whose K/V is now computed and that is not
/// registered yet. A block already cached in another page (computed twice, by sequences that
/// missed together) stays private to `seq`.
fn register_blocks(pool: &mut BlockManager, root: &BlockHash, seq: &mut Sequence) {
    let block_size = pool.block_size();
    let full = seq.computed / block_size;
    if full <= seq.registered {
        return;
    }
    extend_hashes(
        root,
        &mut seq.block_hashes,
        &seq.tokens[..full * block_size],
        block_size,
    );
    for i in seq.registered..full {
        pool.register(seq.pages[i], seq.block_hashes[i]);
    }
    seq.registered = full;
}
