//! The bucket ladder: which `(kind, batch, tokens, context)` points an artifact compiles, how a
//! request is rounded up to one of them, and how the ladder is derived from export options.
//!
//! Decode points are every batch bucket times every context bucket, with one token. Prefill
//! points are every prefill batch bucket times every prefill chunk times every context bucket
//! at least as long as the chunk (an artifact that states no prefill batch buckets has one, of
//! batch 1: prompts are then prefilled one at a time). Selection rounds up and refuses, by name,
//! anything over the top; it never clamps, because a clamped context silently drops a user's
//! history.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The ladder as stored in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ladder {
    pub max_batch: usize,
    pub max_context: usize,
    pub block_size: usize,
    pub batch_buckets: Vec<usize>,
    pub context_buckets: Vec<usize>,
    pub prefill_chunks: Vec<usize>,
    /// How many prompts a prefill entry takes, ascending; absent in artifacts from before prompts
    /// were prefilled together, which therefore mean `[1]` (and are written without it, so that
    /// such an export stays byte-identical).
    #[serde(
        default = "single_prefill_batch",
        skip_serializing_if = "is_single_prefill_batch"
    )]
    pub prefill_batch_buckets: Vec<usize>,
}

/// The prefill batch buckets of a ladder that states none: one prompt at a time.
fn single_prefill_batch() -> Vec<usize> {
    vec![PREFILL_BATCH]
}

// serde's `skip_serializing_if` passes the field itself.
#[allow(clippy::ptr_arg)]
fn is_single_prefill_batch(buckets: &Vec<usize>) -> bool {
    buckets.as_slice() == [PREFILL_BATCH]
}

/// Whether an entry decodes one token per row or prefills a chunk of prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Decode,
    Prefill,
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntryKind::Decode => "decode",
            EntryKind::Prefill => "prefill",
        })
    }
}

/// One compiled shape: `kind`, rows `batch`, tokens per row `tokens`, context `context`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LadderPoint {
    pub kind: EntryKind,
    pub batch: usize,
    pub tokens: usize,
    pub context: usize,
}

impl LadderPoint {
    /// The entry name of this point, e.g. `decode_b8_t1_c512`; also the program file's stem.
    pub fn name(&self) -> String {
        format!(
            "{}_b{}_t{}_c{}",
            self.kind, self.batch, self.tokens, self.context
        )
    }
}

impl fmt::Display for LadderPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The prefill batch of a ladder that states no prefill batch buckets (and the default of
/// [`LadderOptions`]): one prompt per prefill step.
pub const PREFILL_BATCH: usize = 1;

/// Refusals of the ladder: a request it cannot serve, or a ladder that is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LadderError {
    #[error("batch of {requested} rows exceeds the largest batch bucket {max}")]
    BatchTooLarge { requested: usize, max: usize },
    #[error("prefill batch of {requested} prompts exceeds the largest prefill batch bucket {max}")]
    PrefillBatchTooLarge { requested: usize, max: usize },
    #[error("context of {requested} tokens exceeds the largest context bucket {max}")]
    ContextTooLong { requested: usize, max: usize },
    #[error("prefill chunk of {requested} tokens exceeds the largest prefill chunk {max}")]
    PrefillChunkTooLarge { requested: usize, max: usize },
    #[error("{what} must be at least 1, got 0")]
    Empty { what: &'static str },
    #[error("prefill of {tokens} tokens cannot fit a context of {context} tokens")]
    PrefillLongerThanContext { tokens: usize, context: usize },
    #[error(
        "block size {block_size} does not divide context {context}; use a context that is a multiple of {block_size}"
    )]
    BlockSizeDoesNotDivideContext { block_size: usize, context: usize },
    #[error("ladder field {field}: {reason}")]
    Malformed { field: &'static str, reason: String },
    #[error(
        "{num_blocks} KV blocks cannot hold one sequence of the top context {max_context} at block size {block_size}; at least {required} are needed (block 0 is the scratch block)"
    )]
    NotEnoughBlocks {
        num_blocks: usize,
        required: usize,
        max_context: usize,
        block_size: usize,
    },
}

impl Ladder {
    /// Checks the ladder's own invariants; every refusal names the field.
    pub fn validate(&self) -> Result<(), LadderError> {
        if self.block_size == 0 {
            return Err(malformed("blockSize", "must be at least 1".into()));
        }
        check_buckets(
            "batchBuckets",
            &self.batch_buckets,
            self.max_batch,
            "maxBatch",
        )?;
        check_buckets(
            "contextBuckets",
            &self.context_buckets,
            self.max_context,
            "maxContext",
        )?;
        for &context in &self.context_buckets {
            if context % self.block_size != 0 {
                return Err(LadderError::BlockSizeDoesNotDivideContext {
                    block_size: self.block_size,
                    context,
                });
            }
        }
        if self.prefill_chunks.is_empty() {
            return Err(malformed("prefillChunks", "must not be empty".into()));
        }
        check_ascending("prefillChunks", &self.prefill_chunks)?;
        if self.prefill_batch_buckets.is_empty() {
            return Err(malformed("prefillBatchBuckets", "must not be empty".into()));
        }
        check_ascending("prefillBatchBuckets", &self.prefill_batch_buckets)?;
        if let Some(&largest) = self.prefill_batch_buckets.last()
            && largest > self.max_batch
        {
            // Prompts prefilled together are running sequences, and at most maxBatch run.
            return Err(malformed(
                "prefillBatchBuckets",
                format!(
                    "bucket {largest} exceeds maxBatch {} (at most that many sequences run)",
                    self.max_batch
                ),
            ));
        }
        if let Some(&largest) = self.prefill_chunks.last()
            && largest > self.max_context
        {
            return Err(malformed(
                "prefillChunks",
                format!("chunk {largest} exceeds maxContext {}", self.max_context),
            ));
        }
        Ok(())
    }

    /// Every point the artifact compiles, in a stable order (decode first, then prefill).
    pub fn points(&self) -> Vec<LadderPoint> {
        let mut points = Vec::new();
        for &context in &self.context_buckets {
            for &batch in &self.batch_buckets {
                points.push(LadderPoint {
                    kind: EntryKind::Decode,
                    batch,
                    tokens: 1,
                    context,
                });
            }
        }
        for &context in &self.context_buckets {
            for &batch in &self.prefill_batch_buckets {
                for &tokens in self.prefill_chunks.iter().filter(|&&t| t <= context) {
                    points.push(LadderPoint {
                        kind: EntryKind::Prefill,
                        batch,
                        tokens,
                        context,
                    });
                }
            }
        }
        points
    }

    /// The decode point for `batch` rows whose longest sequence holds `context` tokens
    /// (counting the token being decoded), rounded up.
    pub fn decode_entry(&self, batch: usize, context: usize) -> Result<LadderPoint, LadderError> {
        let batch = round_up(batch, &self.batch_buckets).map_err(|e| match e {
            RoundUp::Empty => LadderError::Empty { what: "batch" },
            RoundUp::OverTop(max) => LadderError::BatchTooLarge {
                requested: batch,
                max,
            },
        })?;
        let context = self.context_bucket(context)?;
        Ok(LadderPoint {
            kind: EntryKind::Decode,
            batch,
            tokens: 1,
            context,
        })
    }

    /// The prefill point for one prompt's chunk of `tokens` tokens after which the sequence
    /// holds `context` tokens, rounded up (to the smallest prefill batch bucket). Longer prompts
    /// are split by the caller into chunks of at most [`Ladder::max_prefill_chunk`].
    pub fn prefill_entry(&self, tokens: usize, context: usize) -> Result<LadderPoint, LadderError> {
        self.prefill_batch_entry(1, tokens, context)
    }

    /// The prefill point for `batch` prompts whose chunks hold at most `tokens` tokens and whose
    /// longest sequence holds `context` tokens after the step, rounded up.
    pub fn prefill_batch_entry(
        &self,
        batch: usize,
        tokens: usize,
        context: usize,
    ) -> Result<LadderPoint, LadderError> {
        let batch = round_up(batch, &self.prefill_batch_buckets).map_err(|e| match e {
            RoundUp::Empty => LadderError::Empty { what: "batch" },
            RoundUp::OverTop(max) => LadderError::PrefillBatchTooLarge {
                requested: batch,
                max,
            },
        })?;
        if tokens > context {
            return Err(LadderError::PrefillLongerThanContext { tokens, context });
        }
        let chunk = round_up(tokens, &self.prefill_chunks).map_err(|e| match e {
            RoundUp::Empty => LadderError::Empty { what: "tokens" },
            RoundUp::OverTop(max) => LadderError::PrefillChunkTooLarge {
                requested: tokens,
                max,
            },
        })?;
        // Context is checked on the request first so an over-long prompt is refused as such.
        self.context_bucket(context)?;
        let context = self.context_bucket(context.max(chunk))?;
        Ok(LadderPoint {
            kind: EntryKind::Prefill,
            batch,
            tokens: chunk,
            context,
        })
    }

    /// The most sequences that decode together: the top batch bucket.
    pub fn max_decode_batch(&self) -> usize {
        self.max_batch
    }

    /// The most sequences that prefill together: the top prefill batch bucket.
    pub fn max_prefill_batch(&self) -> usize {
        self.prefill_batch_buckets
            .last()
            .copied()
            .unwrap_or(PREFILL_BATCH)
    }

    /// The prefill batch bucket that holds `rows` prompts (the top one past it).
    pub fn prefill_batch_for(&self, rows: usize) -> usize {
        self.prefill_batch_buckets
            .iter()
            .copied()
            .find(|&b| b >= rows)
            .unwrap_or_else(|| self.max_prefill_batch())
    }

    /// The longest sequence served (prompt and output): the top context bucket.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// The decode points at `point`'s context whose batch is at least `point`'s, smallest
    /// batch first: the buckets a scheduler may choose between for the same rows.
    pub fn decode_points_from(&self, point: LadderPoint) -> impl Iterator<Item = LadderPoint> {
        self.batch_buckets
            .iter()
            .copied()
            .filter(move |&b| b >= point.batch)
            .map(move |batch| LadderPoint {
                kind: EntryKind::Decode,
                batch,
                tokens: 1,
                context: point.context,
            })
    }

    /// The prefill chunk for a prompt with `remaining` tokens left to prefill: the smallest
    /// chunk that holds them all, else the largest (the prompt then takes several chunks).
    pub fn chunk_for(&self, remaining: usize) -> usize {
        self.prefill_chunks
            .iter()
            .copied()
            .find(|&t| t >= remaining)
            .unwrap_or_else(|| self.max_prefill_chunk())
    }

    /// The largest prefill chunk (0 for a ladder with none, which `validate` refuses).
    pub fn max_prefill_chunk(&self) -> usize {
        self.prefill_chunks.last().copied().unwrap_or(0)
    }

    /// Width of the `blockTables` operand for a context bucket.
    pub fn blocks_per_sequence(&self, context: usize) -> usize {
        context / self.block_size.max(1)
    }

    fn context_bucket(&self, context: usize) -> Result<usize, LadderError> {
        round_up(context.max(1), &self.context_buckets).map_err(|e| match e {
            RoundUp::Empty => LadderError::Empty { what: "context" },
            RoundUp::OverTop(max) => LadderError::ContextTooLong {
                requested: context,
                max,
            },
        })
    }
}

enum RoundUp {
    Empty,
    OverTop(usize),
}

fn round_up(value: usize, buckets: &[usize]) -> Result<usize, RoundUp> {
    if value == 0 {
        return Err(RoundUp::Empty);
    }
    buckets
        .iter()
        .copied()
        .find(|&b| b >= value)
        .ok_or_else(|| RoundUp::OverTop(buckets.last().copied().unwrap_or(0)))
}

fn malformed(field: &'static str, reason: String) -> LadderError {
    LadderError::Malformed { field, reason }
}

fn check_ascending(field: &'static str, values: &[usize]) -> Result<(), LadderError> {
    if values.contains(&0) {
        return Err(malformed(field, "entries must be at least 1".into()));
    }
    if let Some(pair) = values.windows(2).find(|w| w[0] >= w[1]) {
        return Err(malformed(
            field,
            format!(
                "must be strictly ascending (no duplicates); found {} before {}",
                pair[0], pair[1]
            ),
        ));
    }
    Ok(())
}

fn check_buckets(
    field: &'static str,
    buckets: &[usize],
    max: usize,
    max_field: &'static str,
) -> Result<(), LadderError> {
    if buckets.is_empty() {
        return Err(malformed(field, "must not be empty".into()));
    }
    check_ascending(field, buckets)?;
    if buckets.last() != Some(&max) {
        return Err(malformed(
            field,
            format!("largest bucket must equal {max_field} {max}"),
        ));
    }
    Ok(())
}

/// Export options that decide the ladder and the KV pool size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LadderOptions {
    pub max_batch: usize,
    pub max_context: usize,
    pub block_size: usize,
    /// Blocks per layer pool, including the scratch block 0.
    pub num_blocks: usize,
    pub prefill_chunks: Vec<usize>,
    /// How many prompts a prefill entry takes; empty means `[1]` (one at a time). Taken
    /// sorted and de-duplicated; the largest must not exceed `max_batch`.
    pub prefill_batch_buckets: Vec<usize>,
    /// Decode batch buckets; empty derives them (powers of two below `max_batch`, then
    /// `max_batch`). When given, the largest must equal `max_batch`.
    pub batch_buckets: Vec<usize>,
    /// Context buckets; empty derives them (doubling from [`MIN_CONTEXT_BUCKET`] up to
    /// `max_context`). When given, the largest must equal `max_context`.
    pub context_buckets: Vec<usize>,
}

/// The smallest context bucket the derived ladder aims for (rounded up to the block size).
pub const MIN_CONTEXT_BUCKET: usize = 128;

impl Default for LadderOptions {
    /// Batch buckets 1, 2, 4, 8; contexts 128, 256, 512; prefill chunks of 16 and 128 tokens
    /// (a short chat turn is prefilled by the 16-token entry instead of paying for 128): 12
    /// decode and 6 prefill entries. The pool holds every row of the top batch at the top
    /// context, plus the scratch block.
    fn default() -> Self {
        LadderOptions::full_pool(8, 512, 16, vec![16, 128])
    }
}

impl LadderOptions {
    /// Options for batches up to `max_batch` and contexts up to `max_context` in blocks of
    /// `block_size`, with the given prefill chunks and derived buckets, and a pool that holds
    /// every row of the top batch at the top context, plus the scratch block.
    pub fn full_pool(
        max_batch: usize,
        max_context: usize,
        block_size: usize,
        prefill_chunks: Vec<usize>,
    ) -> LadderOptions {
        LadderOptions {
            max_batch,
            max_context,
            block_size,
            num_blocks: 1 + max_batch * (max_context / block_size),
            prefill_chunks,
            prefill_batch_buckets: Vec::new(),
            batch_buckets: Vec::new(),
            context_buckets: Vec::new(),
        }
    }

    /// Derives the ladder:
    /// - batch buckets are the powers of two below `max_batch`, then `max_batch` itself;
    /// - context buckets start at the smallest multiple of `block_size` that is at least
    ///   [`MIN_CONTEXT_BUCKET`] (or at `max_context` if that is smaller), double while below
    ///   `max_context`, and end with `max_context` itself;
    /// - prefill chunks and prefill batch buckets are taken as given, sorted and de-duplicated
    ///   (no prefill batch buckets means `[1]`).
    ///
    /// Refuses a `max_context` the block size does not divide and a pool too small to hold one
    /// sequence of the top context.
    pub fn ladder(&self) -> Result<Ladder, LadderError> {
        if self.block_size == 0 {
            return Err(malformed("blockSize", "must be at least 1".into()));
        }
        if self.max_batch == 0 {
            return Err(LadderError::Empty { what: "maxBatch" });
        }
        if self.max_context == 0 {
            return Err(LadderError::Empty { what: "maxContext" });
        }
        if self.max_context % self.block_size != 0 {
            return Err(LadderError::BlockSizeDoesNotDivideContext {
                block_size: self.block_size,
                context: self.max_context,
            });
        }
        let required = 1 + self.max_context / self.block_size;
        if self.num_blocks < required {
            return Err(LadderError::NotEnoughBlocks {
                num_blocks: self.num_blocks,
                required,
                max_context: self.max_context,
                block_size: self.block_size,
            });
        }

        let mut batch_buckets = self.batch_buckets.clone();
        if batch_buckets.is_empty() {
            let mut batch = 1;
            while batch < self.max_batch {
                batch_buckets.push(batch);
                batch *= 2;
            }
            batch_buckets.push(self.max_batch);
        }

        let min_context = MIN_CONTEXT_BUCKET
            .div_ceil(self.block_size)
            .saturating_mul(self.block_size)
            .min(self.max_context);
        let mut context_buckets = self.context_buckets.clone();
        if context_buckets.is_empty() {
            let mut context = min_context;
            while context < self.max_context {
                context_buckets.push(context);
                context = context.saturating_mul(2);
            }
            context_buckets.push(self.max_context);
        }

        let mut prefill_chunks = self.prefill_chunks.clone();
        prefill_chunks.sort_unstable();
        prefill_chunks.dedup();

        let mut prefill_batch_buckets = self.prefill_batch_buckets.clone();
        prefill_batch_buckets.sort_unstable();
        prefill_batch_buckets.dedup();
        if prefill_batch_buckets.is_empty() {
            prefill_batch_buckets = single_prefill_batch();
        }

        let ladder = Ladder {
            max_batch: self.max_batch,
            max_context: self.max_context,
            block_size: self.block_size,
            batch_buckets,
            context_buckets,
            prefill_chunks,
            prefill_batch_buckets,
        };
        ladder.validate()?;
        Ok(ladder)
    }
}
