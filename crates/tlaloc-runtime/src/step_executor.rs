//! The step executor: runs rows laid out by any caller on the artifact's entries, with the K/V
//! pools donated and kept on the device. It is the seam below the scheduler — what an external
//! scheduler (vLLM's, which owns the block tables) calls to run one step of its batch.
//!
//! A row is a sequence's next tokens, the position of the first, the sequence's pages and
//! whether its logits are wanted. Rows of one token decode together, in as few decode entries
//! as the ladder allows; longer rows (prompt chunks of any length) run through prefill entries
//! in the ladder's chunks, the last chunk giving the row's output. Every row is checked against
//! the pool and the ladder first, so a bad row is refused by name before anything runs.

use thiserror::Error;

use crate::block_manager::PageId;
use crate::executor::{ExecutorError, LadderPoint, ModelExecutor, ModelShape};
use crate::layout::{self, LayoutError, RowInput};
use tlaloc_artifact::LadderError;

/// One row of a step, as the caller lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    /// The tokens to process, in order (one for a decode row).
    pub token_ids: Vec<u32>,
    /// The position of `token_ids[0]` in its sequence; the K/V of the positions before it
    /// must already be in `block_ids`' pages.
    pub start: usize,
    /// The sequence's pages, in order (block ids of the K/V pools; 0 is the reserved scratch
    /// page and is refused).
    pub block_ids: Vec<PageId>,
    /// Whether the row's logits are returned (the next token always is).
    pub want_logits: bool,
}

/// What a step produced for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowOutput {
    /// The in-graph greedy next token after the row's last token.
    pub next_token: u32,
    /// The logits of the row's last token (`[V]`), when asked for.
    pub logits: Option<Vec<f32>>,
}

/// A step refused or failed; every refusal names the row.
#[derive(Debug, Error)]
pub enum StepError {
    /// A row with no tokens.
    #[error("row {row} has no tokens; a row needs at least 1")]
    EmptyRow { row: usize },
    /// A block id that is the scratch page or outside the pool.
    #[error(
        "row {row}: block id {block} refused; the pool's allocatable blocks are 1..{num_blocks} (block 0 is the reserved scratch page)"
    )]
    BadBlock {
        row: usize,
        block: PageId,
        num_blocks: usize,
    },
    /// A row whose pages do not hold its tokens.
    #[error("row {row} reaches {context} tokens but its {pages} blocks hold only {holds}")]
    TooFewBlocks {
        row: usize,
        context: usize,
        pages: usize,
        holds: usize,
    },
    /// A row the ladder cannot hold (past the top context bucket).
    #[error("row {row}: {source}")]
    Ladder {
        row: usize,
        #[source]
        source: LadderError,
    },
    /// A row that does not fit the entry chosen for it (too few pages for its tokens).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The executor failed; the pools' contents are then unknown.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
}

/// Runs caller-laid-out rows on a [`ModelExecutor`].
#[derive(Debug)]
pub struct StepExecutor<E> {
    executor: E,
}

impl<E: ModelExecutor> StepExecutor<E> {
    /// Wraps an executor (for the PJRT runtime, a loaded [`crate::Model`]).
    pub fn new(executor: E) -> Self {
        Self { executor }
    }

    /// The model's shape: vocabulary, block size, pool size, ladder.
    pub fn shape(&self) -> &ModelShape {
        self.executor.shape()
    }

    /// The executor itself.
    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// Runs one step of `rows` and returns one output per row, in row order.
    pub fn execute(&mut self, rows: &[StepRow]) -> Result<Vec<RowOutput>, StepError> {
        for (r, row) in rows.iter().enumerate() {
            self.check(r, row)?;
        }
        let mut outputs: Vec<Option<RowOutput>> = vec![None; rows.len()];
        let decode: Vec<usize> = (0..rows.len())
            .filter(|&r| rows[r].token_ids.len() == 1)
            .collect();
        for group in decode.chunks(self.shape().ladder.max_decode_batch()) {
            self.run_decode(rows, group, &mut outputs)?;
        }
        for r in (0..rows.len()).filter(|&r| rows[r].token_ids.len() > 1) {
            outputs[r] = Some(self.run_prefill(r, &rows[r])?);
        }
        Ok(outputs
            .into_iter()
            .map(|o| o.expect("every row ran"))
            .collect())
    }

    fn check(&self, r: usize, row: &StepRow) -> Result<(), StepError> {
        let shape = self.shape();
        if row.token_ids.is_empty() {
            return Err(StepError::EmptyRow { row: r });
        }
        if let Some(&block) = row
            .block_ids
            .iter()
            .find(|&&b| b == 0 || b as usize >= shape.num_blocks)
        {
            return Err(StepError::BadBlock {
                row: r,
                block,
                num_blocks: shape.num_blocks,
            });
        }
        let context = row.start + row.token_ids.len();
        let holds = row.block_ids.len() * shape.block_size;
        if context > holds {
            return Err(StepError::TooFewBlocks {
                row: r,
                context,
                pages: row.block_ids.len(),
                holds,
            });
        }
        if context > shape.ladder.max_context() {
            return Err(StepError::Ladder {
                row: r,
                source: LadderError::ContextTooLong {
                    requested: context,
                    max: shape.ladder.max_context(),
                },
            });
        }
        Ok(())
    }

    fn run_decode(
        &mut self,
        rows: &[StepRow],
        group: &[usize],
        outputs: &mut [Option<RowOutput>],
    ) -> Result<(), StepError> {
        let context = group
            .iter()
            .map(|&r| rows[r].start + 1)
            .max()
            .expect("a non-empty group");
        let entry = self
            .shape()
            .ladder
            .decode_entry(group.len(), context)
            .map_err(|source| StepError::Ladder {
                row: group[0],
                source,
            })?;
        let inputs: Vec<RowInput<'_>> = group
            .iter()
            .map(|&r| RowInput {
                tokens: &rows[r].token_ids,
                start: rows[r].start,
                pages: &rows[r].block_ids,
            })
            .collect();
        let want: Vec<bool> = group.iter().map(|&r| rows[r].want_logits).collect();
        for (i, out) in self.run(entry, &inputs, &want)?.into_iter().enumerate() {
            outputs[group[i]] = Some(out);
        }
        Ok(())
    }

    /// A row of several tokens, in the ladder's chunks; the last chunk gives its output.
    fn run_prefill(&mut self, r: usize, row: &StepRow) -> Result<RowOutput, StepError> {
        let ladder = self.shape().ladder.clone();
        let mut start = row.start;
        let mut rest = row.token_ids.as_slice();
        loop {
            let take = rest.len().min(ladder.max_prefill_chunk());
            let (chunk, after) = rest.split_at(take);
            let entry = ladder
                .prefill_entry(chunk.len(), start + chunk.len())
                .map_err(|source| StepError::Ladder { row: r, source })?;
            let input = RowInput {
                tokens: chunk,
                start,
                pages: &row.block_ids,
            };
            let last = after.is_empty();
            let out = self.run(entry, &[input], &[last && row.want_logits])?;
            if last {
                return Ok(out.into_iter().next().expect("one row"));
            }
            start += chunk.len();
            rest = after;
        }
    }

    fn run(
        &mut self,
        entry: LadderPoint,
        rows: &[RowInput<'_>],
        want_logits: &[bool],
    ) -> Result<Vec<RowOutput>, StepError> {
        let block_size = self.shape().block_size;
        let vocab = self.shape().vocab_size;
        let mut inputs = layout::lay_out(entry, block_size, rows)?;
        inputs.want_logits = want_logits.iter().any(|&w| w);
        let output = self.executor.step(&entry, &inputs)?;
        let malformed = |what: String| ExecutorError::Device {
            entry,
            message: format!("malformed step output: {what}"),
        };
        if output.next_tokens.len() < rows.len() {
            return Err(malformed(format!(
                "{} next tokens for {} rows",
                output.next_tokens.len(),
                rows.len()
            ))
            .into());
        }
        (0..rows.len())
            .map(|r| {
                let logits = match (&output.logits, want_logits[r]) {
                    (Some(l), true) if l.len() >= (r + 1) * vocab => {
                        Some(l[r * vocab..(r + 1) * vocab].to_vec())
                    }
                    (_, true) => return Err(malformed("logits missing or short".into()).into()),
                    (_, false) => None,
                };
                let next = output.next_tokens[r];
                let next_token = u32::try_from(next)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| malformed(format!("row {r} produced token {next}")))?;
                Ok(RowOutput { next_token, logits })
            })
            .collect()
    }
}
