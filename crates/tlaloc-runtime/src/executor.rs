//! What the scheduler asks of a model: run one entry on one step's inputs, return the next
//! token of every row (and the logits when asked). The PJRT-backed implementation is
//! [`crate::model::Model`]; tests drive the scheduler through a fake.

use std::time::Duration;

use thiserror::Error;

use tlaloc_artifact::StepInput;
pub use tlaloc_artifact::{EntryKind, Ladder, LadderPoint};

/// The inputs of one step, row-major, exactly as the forward-program contract names them.
///
/// A live row's real tokens are left-aligned; its padding tokens (a prefill chunk shorter than
/// T) have token 0, position 0 and slot -1. `seqLens[b]` is the row's context length after the
/// step, so the last real token, whose logits the program returns, sits at index
/// `seqLens[b] - 1 - positions[b, 0]`. Dead rows hold the contract's padding values
/// ([`StepInput::padding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInputs {
    /// `[B, T]`.
    pub token_ids: Vec<i32>,
    /// `[B, T]`.
    pub positions: Vec<i32>,
    /// `[B, C / blockSize]`.
    pub block_tables: Vec<i32>,
    /// `[B]`.
    pub seq_lens: Vec<i32>,
    /// `[B * T]`: `page * blockSize + offset`, or -1 for a token that writes nothing.
    pub slot_mapping: Vec<i32>,
    /// Whether any row needs its logits on the host (sampling or logprobs).
    pub want_logits: bool,
}

impl StepInputs {
    /// The inputs of `point` with every row dead: each array at its contract dims, filled with
    /// its padding value. A step lays its live rows over this.
    pub fn padded(point: LadderPoint, block_size: usize) -> StepInputs {
        let fill = |input: StepInput| {
            let len = input.dims(point, block_size).iter().product();
            vec![input.padding(); len]
        };
        StepInputs {
            token_ids: fill(StepInput::TokenIds),
            positions: fill(StepInput::Positions),
            block_tables: fill(StepInput::BlockTables),
            seq_lens: fill(StepInput::SeqLens),
            slot_mapping: fill(StepInput::SlotMapping),
            want_logits: false,
        }
    }

    /// The array of step input `input`.
    pub fn array(&self, input: StepInput) -> &[i32] {
        match input {
            StepInput::TokenIds => &self.token_ids,
            StepInput::Positions => &self.positions,
            StepInput::BlockTables => &self.block_tables,
            StepInput::SeqLens => &self.seq_lens,
            StepInput::SlotMapping => &self.slot_mapping,
        }
    }
}

/// What one step returns to the host.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The in-graph argmax of each row, `[B]`.
    pub next_tokens: Vec<i32>,
    /// The last real token's logits per row, `[B, V]` row-major, when `want_logits` was set.
    pub logits: Option<Vec<f32>>,
    /// Where the step's time went inside the executor.
    pub timings: StepTimings,
}

/// Wall time of one step, split by phase. The executor fills `upload`, `execute` and
/// `readback`; the engine adds `build` and `other` (whatever the executor's own phases do not
/// cover: releasing buffers, a lazy compile).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimings {
    /// Choosing the step and building its input arrays on the host.
    pub build: Duration,
    /// Host to device copies of the inputs.
    pub upload: Duration,
    /// The execute call itself (the launch; it does not wait for the device).
    pub execute: Duration,
    /// Waiting for the device and copying next tokens (and logits) back.
    pub readback: Duration,
    /// The rest of the executor's call.
    pub other: Duration,
}

impl StepTimings {
    /// The sum of the phases: the step's wall time as the engine sees it.
    pub fn total(&self) -> Duration {
        self.build + self.upload + self.execute + self.readback + self.other
    }
}

impl std::ops::AddAssign for StepTimings {
    fn add_assign(&mut self, rhs: Self) {
        self.build += rhs.build;
        self.upload += rhs.upload;
        self.execute += rhs.execute;
        self.readback += rhs.readback;
        self.other += rhs.other;
    }
}

/// A step that failed inside the executor.
#[derive(Debug, Error)]
pub enum ExecutorError {
    /// The entry is not in the artifact.
    #[error("no compiled entry {0}; the artifact's ladder does not have it")]
    UnknownEntry(LadderPoint),
    /// The inputs disagree with the entry's shape.
    #[error("step inputs for entry {entry}: {what}")]
    BadInputs { entry: LadderPoint, what: String },
    /// The plugin refused or failed the step.
    #[error("step on entry {entry} failed: {message}")]
    Device { entry: LadderPoint, message: String },
}

/// Static facts about the model that the scheduler and the benchmark need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    /// Vocabulary size (V, the logits' row length).
    pub vocab_size: usize,
    /// Tokens per K/V page.
    pub block_size: usize,
    /// Pages in each pool, the scratch page included.
    pub num_blocks: usize,
    /// The ladder of compiled entries (every point of it is an entry).
    pub ladder: Ladder,
    /// End-of-sequence token ids (a request stops on them unless it ignores eos).
    pub eos_token_ids: Vec<u32>,
    /// Bytes of all weights (read once per step: the memory-bound floor).
    pub weight_bytes: u64,
    /// Bytes of K and V, all layers, for one token of context (read per step per token).
    pub kv_bytes_per_token: u64,
}

impl ModelShape {
    /// Pages sequences can hold: every page but the scratch page.
    pub fn allocatable_pages(&self) -> usize {
        tlaloc_artifact::KvCacheLayout::allocatable_blocks_of(self.num_blocks)
    }

    /// Bytes a decode step must read at least: every weight once, plus each row's K/V.
    pub fn decode_floor_bytes(&self, context_tokens: &[usize]) -> u64 {
        let kv: u64 =
            context_tokens.iter().map(|&t| t as u64).sum::<u64>() * self.kv_bytes_per_token;
        self.weight_bytes + kv
    }
}

/// Where start-up time went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadTimings {
    /// Reading and checking the artifact (and re-hashing it when verifying).
    pub open: Duration,
    /// Loading the plugin and creating the client.
    pub client: Duration,
    /// Compiling entries (or loading them from the compile cache). This phase, the weight upload
    /// and the pool allocation run at the same time, each timed on its own clock, so the three
    /// add up to more than `total`.
    pub compile: Duration,
    /// Uploading weights to the device (overlaps `compile`).
    pub upload_weights: Duration,
    /// Of the upload, reading weight files into host memory, summed over the upload threads.
    pub upload_read: Duration,
    /// Of the upload, handing bytes to the plugin until it no longer reads them, summed over
    /// the upload threads.
    pub upload_transfer: Duration,
    /// Of the upload, the bytes handed over from host memory the plugin mapped for DMA
    /// (pinned); 0 where the plugin maps none.
    pub upload_pinned_bytes: u64,
    /// Allocating the zero-filled K/V pools on the device (overlaps `compile`).
    pub allocate_pools: Duration,
    /// From the start of loading to ready.
    pub total: Duration,
    /// Entries compiled now.
    pub compiled: usize,
    /// Entries taken from the compile cache.
    pub cache_hits: usize,
    /// Entries deserialized from executables shipped in the artifact.
    pub from_artifact: usize,
    /// The one line saying which entries came from the artifact's executables and why the
    /// others were compiled; `None` when the artifact ships none.
    pub executables: Option<String>,
    /// Entries left to compile on first use (lazy compilation).
    pub deferred: usize,
    /// The one line saying which entries run a body variant and why the others do not;
    /// `None` when the artifact has no variants.
    pub bodies: Option<String>,
}

/// The default [`ModelExecutor::decode_chain_window`]: decode steps are chained on the device
/// while their tokens arrive within 20 ms of each other.
pub const DECODE_CHAIN_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs compiled entries; one implementation per backend.
pub trait ModelExecutor {
    /// The model's shape and ladder.
    fn shape(&self) -> &ModelShape;

    /// Where start-up time went, when the executor measured it.
    fn load_timings(&self) -> Option<LoadTimings> {
        None
    }

    /// The plugin and device it runs on, when it runs on one.
    fn platform(&self) -> Option<crate::model::Platform> {
        None
    }

    /// Runs `entry` on `inputs`; the K/V pools are updated in place (on the device).
    fn step(
        &mut self,
        entry: &LadderPoint,
        inputs: &StepInputs,
    ) -> Result<StepOutput, ExecutorError>;

    /// Whether every entry is ready to run without compiling first. The scheduler tries other
    /// decode buckets than the smallest only then (trying one must not cost a compile).
    fn all_entries_compiled(&self) -> bool {
        true
    }

    /// The longest decode chain ([`decode_chain`](Self::decode_chain)) the engine may ask for;
    /// 1 turns chaining off.
    fn max_decode_chain(&self) -> usize {
        1
    }

    /// How long a chain of decode steps may take, by the measured step time: it bounds the
    /// burst in which a stream receives its tokens.
    fn decode_chain_window(&self) -> std::time::Duration {
        DECODE_CHAIN_WINDOW
    }

    /// Runs the decode entry `entry` once per element of `steps`, in order, and returns every
    /// step's output. The first step's token ids are `steps[0].token_ids`; each later step's
    /// token ids are the previous step's greedy next tokens (its own `token_ids` are ignored),
    /// which a device executor passes from one step to the next without the host, so the
    /// device never waits for the host between the steps of a chain.
    ///
    /// A device executor may also take each later step's other inputs from the step before it
    /// (the contract's `tlaloc_artifact::next_decode_row`) instead of `steps`. That agrees with
    /// `steps` ([`chain_steps`](crate::layout::chain_steps)) on every row that still has budget;
    /// a row whose budget has ended keeps decoding there instead of writing nothing, and its
    /// tokens are dropped either way.
    ///
    /// This default feeds the tokens through the host, one [`step`](Self::step) at a time.
    fn decode_chain(
        &mut self,
        entry: &LadderPoint,
        steps: &[StepInputs],
    ) -> Result<Vec<StepOutput>, ExecutorError> {
        let mut outputs: Vec<StepOutput> = Vec::with_capacity(steps.len());
        for inputs in steps {
            let output = match outputs.last() {
                None => self.step(entry, inputs)?,
                Some(previous) => {
                    let fed = StepInputs {
                        token_ids: previous.next_tokens.clone(),
                        ..inputs.clone()
                    };
                    self.step(entry, &fed)?
                }
            };
            outputs.push(output);
        }
        Ok(outputs)
    }
}
