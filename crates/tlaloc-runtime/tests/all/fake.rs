//! A test double for scheduling: a "model" whose next token is a hash of the context it reads
//! back from its own paged pools through `blockTables` and `seqLens`.
//!
//! It stores `(token, position)` at every slot that `slotMapping` names, so a wrong slot, a
//! wrong page in a block table, a wrong `seqLens` or a write by a padded row changes what later
//! steps read, and so the tokens. `reference_next` computes the same hash from the plain token
//! list, with no pages at all: it is the independent reference the scheduler's output is
//! checked against. Contract violations (a live write into the scratch page, a write outside
//! the row's own pages, an entry not in the ladder) fail the step with a message.

use std::collections::HashSet;

use tlaloc_runtime::{
    ExecutorError, Ladder, LadderPoint, ModelExecutor, ModelShape, StepInputs, StepOutput,
    StepTimings,
};

pub const VOCAB: usize = 97;

fn mix(mut h: u64, x: u64) -> u64 {
    h ^= x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 31)
}

fn hash_context(context: impl Iterator<Item = (u32, usize)>) -> u64 {
    context.fold(0x1234_5678, |h, (token, pos)| {
        mix(mix(h, token as u64), pos as u64)
    })
}

/// The next token of a sequence, from its tokens alone.
pub fn reference_next(tokens: &[u32]) -> u32 {
    let h = hash_context(tokens.iter().enumerate().map(|(p, t)| (*t, p)));
    (h % VOCAB as u64) as u32
}

/// The logits row the fake returns for a context hash: the reference token is the argmax.
fn logits_row(tokens_hash: u64, next: u32, row: &mut [f32]) {
    for (v, x) in row.iter_mut().enumerate() {
        *x = (mix(tokens_hash, v as u64) % 400) as f32 / 100.0;
    }
    row[next as usize] = 5.0;
}

/// Greedy generation by the reference, with the engine's stop rules.
pub fn reference_generate(prompt: &[u32], max_tokens: usize, eos: &[u32]) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let next = reference_next(&tokens);
        tokens.push(next);
        out.push(next);
        if eos.contains(&next) {
            break;
        }
    }
    out
}

#[derive(Debug)]
pub struct FakeModel {
    shape: ModelShape,
    pool: Vec<Option<(u32, usize)>>,
    gate: Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
    max_chain: usize,
}

impl FakeModel {
    pub fn new(grid: Grid, block_size: usize, num_blocks: usize) -> Self {
        FakeModel {
            shape: ModelShape {
                vocab_size: VOCAB,
                block_size,
                num_blocks,
                ladder: grid.ladder(block_size),
                eos_token_ids: vec![],
                weight_bytes: 1000,
                kv_bytes_per_token: 10,
            },
            pool: vec![None; num_blocks * block_size],
            gate: None,
            max_chain: 1,
        }
    }

    /// Makes every step wait for one permit on `gate` (no waiting once its sender is gone), so
    /// a test can hold the engine between two steps.
    pub fn with_gate(mut self, gate: std::sync::mpsc::Receiver<()>) -> Self {
        self.gate = Some(std::sync::Mutex::new(gate));
        self
    }

    /// Lets the engine chain up to `steps` decode steps (fed through the host by the trait's
    /// own `decode_chain`).
    pub fn with_chain(mut self, steps: usize) -> Self {
        self.max_chain = steps;
        self
    }

    pub fn with_eos(mut self, eos: Vec<u32>) -> Self {
        self.shape.eos_token_ids = eos;
        self
    }
}

/// The buckets of a ladder (its block size comes with the model): decode at each batch,
/// prefill at each prefill batch (1 unless [`Grid::prefill_batches`] says) for each chunk,
/// every context.
#[derive(Debug, Clone)]
pub struct Grid {
    batches: Vec<usize>,
    chunks: Vec<usize>,
    contexts: Vec<usize>,
    prefill_batches: Vec<usize>,
}

pub fn grid(batches: &[usize], chunks: &[usize], contexts: &[usize]) -> Grid {
    Grid {
        batches: batches.to_vec(),
        chunks: chunks.to_vec(),
        contexts: contexts.to_vec(),
        prefill_batches: vec![1],
    }
}

impl Grid {
    /// The same grid whose prefill entries take `batches` prompts.
    pub fn prefill_batches(mut self, batches: &[usize]) -> Self {
        self.prefill_batches = batches.to_vec();
        self
    }

    pub fn ladder(&self, block_size: usize) -> Ladder {
        let ladder = Ladder {
            max_batch: *self.batches.last().expect("a batch bucket"),
            max_context: *self.contexts.last().expect("a context bucket"),
            block_size,
            batch_buckets: self.batches.clone(),
            context_buckets: self.contexts.clone(),
            prefill_chunks: self.chunks.clone(),
            prefill_batch_buckets: self.prefill_batches.clone(),
        };
        ladder.validate().expect("a valid test ladder");
        ladder
    }
}

impl ModelExecutor for FakeModel {
    fn shape(&self) -> &ModelShape {
        &self.shape
    }

    fn max_decode_chain(&self) -> usize {
        self.max_chain
    }

    fn step(
        &mut self,
        entry: &LadderPoint,
        inputs: &StepInputs,
    ) -> Result<StepOutput, ExecutorError> {
        let bad = |what: String| ExecutorError::BadInputs {
            entry: *entry,
            what,
        };
        if !self.shape.ladder.points().contains(entry) {
            return Err(ExecutorError::UnknownEntry(*entry));
        }
        if let Some(gate) = &self.gate {
            let _ = gate.lock().expect("gate lock").recv();
        }
        let (b, t, bs) = (entry.batch, entry.tokens, self.shape.block_size);
        let cols = entry.context / bs;
        let dims_ok = inputs.token_ids.len() == b * t
            && inputs.positions.len() == b * t
            && inputs.block_tables.len() == b * cols
            && inputs.seq_lens.len() == b
            && inputs.slot_mapping.len() == b * t;
        if !dims_ok {
            return Err(bad("input lengths disagree with the entry".into()));
        }
        for row in 0..b {
            let table: HashSet<i32> = inputs.block_tables[row * cols..(row + 1) * cols]
                .iter()
                .copied()
                .collect();
            let len = inputs.seq_lens[row];
            if len < 1 || len as usize > entry.context {
                return Err(bad(format!("row {row}: seqLens {len}")));
            }
            for k in 0..t {
                let slot = inputs.slot_mapping[row * t + k];
                if slot < 0 {
                    continue;
                }
                let slot = slot as usize;
                if slot >= self.pool.len() {
                    return Err(bad(format!("row {row}: slot {slot} outside the pool")));
                }
                let page = (slot / bs) as i32;
                if page == 0 {
                    return Err(bad(format!(
                        "row {row}: a live write into the scratch page"
                    )));
                }
                if !table.contains(&page) {
                    return Err(bad(format!(
                        "row {row}: slot {slot} is not in its block table"
                    )));
                }
                let pos = inputs.positions[row * t + k] as usize;
                if pos / bs >= cols || inputs.block_tables[row * cols + pos / bs] != page {
                    return Err(bad(format!(
                        "row {row}: position {pos} written to slot {slot}, not its page"
                    )));
                }
                self.pool[slot] = Some((inputs.token_ids[row * t + k] as u32, pos));
            }
        }
        let mut next_tokens = Vec::with_capacity(b);
        let mut logits = inputs.want_logits.then(|| vec![0.0f32; b * VOCAB]);
        for row in 0..b {
            let len = inputs.seq_lens[row] as usize;
            let context = (0..len).map(|p| {
                let page = inputs.block_tables[row * cols + p / bs] as usize;
                // A slot never written (or stale) reads as a marker the reference never makes.
                self.pool[page * bs + p % bs].unwrap_or((u32::MAX, usize::MAX))
            });
            let h = hash_context(context);
            let next = (h % VOCAB as u64) as u32;
            next_tokens.push(next as i32);
            if let Some(l) = logits.as_mut() {
                logits_row(h, next, &mut l[row * VOCAB..(row + 1) * VOCAB]);
            }
        }
        Ok(StepOutput {
            next_tokens,
            logits,
            timings: StepTimings::default(),
        })
    }
}
