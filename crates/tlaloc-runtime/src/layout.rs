//! Step input layout: where each live row's tokens, positions, pages and K/V slots go in one
//! step's input arrays. Pure functions of the rows, so the scheduler and the step executor
//! (which takes rows from any caller) lay steps out the same way.
//!
//! A row's real tokens are left-aligned; padding tokens after them, and rows past the live ones,
//! hold the step contract's padding values ([`StepInputs::padded`]). A row's `seqLens` is its
//! context length after the step (the last real token's position + 1), so its last real token
//! sits at index `seqLens[b] - 1 - positions[b, 0]`: the token whose logits the program returns.

use thiserror::Error;

use crate::block_manager::PageId;
use crate::executor::{LadderPoint, StepInputs};

/// One live row of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowInput<'a> {
    /// The tokens the step processes for this row, in order.
    pub tokens: &'a [u32],
    /// The position of `tokens[0]` in its sequence (the tokens before it are in the pools).
    pub start: usize,
    /// The sequence's pages in order; they must cover `start + tokens.len()` tokens.
    pub pages: &'a [PageId],
}

/// Rows that do not fit the entry they are laid out for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// More rows than the entry's batch.
    #[error("{rows} rows do not fit entry {entry} of batch {batch}")]
    TooManyRows {
        entry: LadderPoint,
        rows: usize,
        batch: usize,
    },
    /// A row with no tokens, or more than the entry takes per row.
    #[error("row {row} has {tokens} tokens; entry {entry} takes 1 to {max} per row")]
    BadTokenCount {
        entry: LadderPoint,
        row: usize,
        tokens: usize,
        max: usize,
    },
    /// A row whose context after the step exceeds the entry's.
    #[error("row {row} reaches {context} tokens of context, past entry {entry}'s {max}")]
    PastContext {
        entry: LadderPoint,
        row: usize,
        context: usize,
        max: usize,
    },
    /// A row whose pages do not hold its tokens.
    #[error("row {row} needs {needed} pages for {context} tokens but has {pages}")]
    TooFewPages {
        row: usize,
        context: usize,
        needed: usize,
        pages: usize,
    },
    /// A token id or page number past what an i32 operand holds.
    #[error("row {row}: {what} {value} does not fit an i32 operand")]
    NotI32 {
        row: usize,
        what: &'static str,
        value: u64,
    },
}

/// The pool slot of the token at `pos` of a sequence with `pages`: its page's first slot plus
/// the offset in the page.
pub fn slot_of(pages: &[PageId], pos: usize, block_size: usize) -> i32 {
    let page = pages[pos / block_size] as usize;
    (page * block_size + pos % block_size) as i32
}

/// The inputs of entry `point` for `rows` (rows past them are dead), for pages of
/// `block_size` tokens; checked, so that rows from any caller either fit or are refused by name.
pub fn lay_out(
    point: LadderPoint,
    block_size: usize,
    rows: &[RowInput<'_>],
) -> Result<StepInputs, LayoutError> {
    if rows.len() > point.batch {
        return Err(LayoutError::TooManyRows {
            entry: point,
            rows: rows.len(),
            batch: point.batch,
        });
    }
    let t = point.tokens;
    let cols = point.context / block_size;
    let mut inputs = StepInputs::padded(point, block_size);
    for (r, row) in rows.iter().enumerate() {
        if row.tokens.is_empty() || row.tokens.len() > t {
            return Err(LayoutError::BadTokenCount {
                entry: point,
                row: r,
                tokens: row.tokens.len(),
                max: t,
            });
        }
        let context = row.start + row.tokens.len();
        if context > point.context {
            return Err(LayoutError::PastContext {
                entry: point,
                row: r,
                context,
                max: point.context,
            });
        }
        let needed = context.div_ceil(block_size);
        if row.pages.len() < needed {
            return Err(LayoutError::TooFewPages {
                row: r,
                context,
                needed,
                pages: row.pages.len(),
            });
        }
        let not_i32 = |what, value: u64| LayoutError::NotI32 {
            row: r,
            what,
            value,
        };
        for (j, &page) in row.pages.iter().take(cols).enumerate() {
            inputs.block_tables[r * cols + j] =
                i32::try_from(page).map_err(|_| not_i32("page", u64::from(page)))?;
        }
        for (k, &token) in row.tokens.iter().enumerate() {
            let pos = row.start + k;
            inputs.token_ids[r * t + k] =
                i32::try_from(token).map_err(|_| not_i32("token id", u64::from(token)))?;
            inputs.positions[r * t + k] = pos as i32;
            inputs.slot_mapping[r * t + k] = slot_of(row.pages, pos, block_size);
        }
        inputs.seq_lens[r] = context as i32;
    }
    Ok(inputs)
}

/// One row of a decode chain: the row decoded at `position` in the chain's first step, with
/// `budget` tokens it may still generate (the first step's included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainRow<'a> {
    /// The position of the token the first step decodes.
    pub position: usize,
    /// Tokens the row may still generate, the first step's included.
    pub budget: usize,
    /// The sequence's pages; they must cover every position the row writes in the chain.
    pub pages: &'a [PageId],
}

/// The inputs of the decode steps `1..chain` after the decode step `first` of `rows`, each row
/// one token further on. Token ids are 0: each step's come from the previous step's output on
/// the device. A row whose budget ends before a step computes there but writes nothing
/// (slot -1) and keeps its last positions, so its extra tokens are dropped.
pub fn chain_steps(
    first: &StepInputs,
    rows: &[ChainRow<'_>],
    chain: usize,
    block_size: usize,
) -> Vec<StepInputs> {
    let mut chained = Vec::with_capacity(chain.saturating_sub(1));
    let mut inputs = first.clone();
    for k in 1..chain {
        for (r, row) in rows.iter().enumerate() {
            inputs.token_ids[r] = 0;
            if k >= row.budget {
                inputs.slot_mapping[r] = -1;
                continue;
            }
            let pos = row.position + k;
            inputs.positions[r] = pos as i32;
            inputs.seq_lens[r] = (pos + 1) as i32;
            inputs.slot_mapping[r] = slot_of(row.pages, pos, block_size);
        }
        chained.push(inputs.clone());
    }
    chained
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::EntryKind;
    use tlaloc_artifact::StepInput;

    fn point(batch: usize, tokens: usize, context: usize) -> LadderPoint {
        LadderPoint {
            kind: if tokens == 1 {
                EntryKind::Decode
            } else {
                EntryKind::Prefill
            },
            batch,
            tokens,
            context,
        }
    }

    /// The layout follows the contract's rules position by position: a prefill chunk of 3 real
    /// tokens continuing at position 5 in a 4-token row, pages [7, 2] of 4 tokens, then a dead
    /// row; every value below is the rule applied by hand (slot = page * 4 + pos % 4).
    #[test]
    fn a_continued_chunk_and_a_dead_row_are_laid_out_by_the_contract() {
        let pages = [7, 2];
        let rows = [RowInput {
            tokens: &[11, 12, 13],
            start: 5,
            pages: &pages,
        }];
        let inputs = lay_out(point(2, 4, 8), 4, &rows).unwrap();
        let pad = |i: StepInput| i.padding();
        assert_eq!(
            inputs.token_ids,
            [11, 12, 13, pad(StepInput::TokenIds), 0, 0, 0, 0]
        );
        assert_eq!(inputs.positions, [5, 6, 7, 0, 0, 0, 0, 0]);
        assert_eq!(inputs.block_tables, [7, 2, 0, 0]);
        assert_eq!(inputs.seq_lens, [8, pad(StepInput::SeqLens)]);
        // Positions 5, 6 and 7 are offsets 1, 2 and 3 of the second page, page 2.
        assert_eq!(inputs.slot_mapping, [9, 10, 11, -1, -1, -1, -1, -1]);
        assert!(!inputs.want_logits);
        // The last real token sits where the module doc says.
        let last = inputs.seq_lens[0] - 1 - inputs.positions[0];
        assert_eq!(inputs.token_ids[last as usize], 13);
    }

    #[test]
    fn rows_that_do_not_fit_are_refused_by_name() {
        let pages = [1];
        let row = |tokens: &'static [u32], start| RowInput {
            tokens,
            start,
            pages: &pages,
        };
        let p = point(1, 2, 8);
        assert!(matches!(
            lay_out(p, 4, &[row(&[1], 0), row(&[1], 0)]),
            Err(LayoutError::TooManyRows { rows: 2, .. })
        ));
        assert!(matches!(
            lay_out(p, 4, &[row(&[1, 2, 3], 0)]),
            Err(LayoutError::BadTokenCount { tokens: 3, .. })
        ));
        assert!(matches!(
            lay_out(p, 4, &[row(&[], 0)]),
            Err(LayoutError::BadTokenCount { tokens: 0, .. })
        ));
        assert!(matches!(
            lay_out(p, 4, &[row(&[1], 8)]),
            Err(LayoutError::PastContext { context: 9, .. })
        ));
        assert!(matches!(
            lay_out(p, 4, &[row(&[1], 4)]),
            Err(LayoutError::TooFewPages { needed: 2, .. })
        ));
        assert!(matches!(
            lay_out(p, 4, &[row(&[u32::MAX], 0)]),
            Err(LayoutError::NotI32 {
                what: "token id",
                ..
            })
        ));
    }

    #[test]
    fn a_chain_advances_each_row_and_a_row_past_its_budget_writes_nothing() {
        let (a, b) = ([1, 3], [2]);
        let rows = [
            RowInput {
                tokens: &[40],
                start: 3,
                pages: &a,
            },
            RowInput {
                tokens: &[50],
                start: 0,
                pages: &b,
            },
        ];
        let first = lay_out(point(2, 1, 8), 4, &rows).unwrap();
        let chain = [
            ChainRow {
                position: 3,
                budget: 3,
                pages: &a,
            },
            ChainRow {
                position: 0,
                budget: 1,
                pages: &b,
            },
        ];
        let steps = chain_steps(&first, &chain, 3, 4);
        assert_eq!(steps.len(), 2);
        // Row 0: positions 4 and 5 land in page 3 (slots 12, 13).
        assert_eq!(steps[0].positions, [4, 0]);
        assert_eq!(steps[0].slot_mapping, [12, -1]);
        assert_eq!(steps[1].positions, [5, 0]);
        assert_eq!(steps[1].seq_lens, [6, 1]);
        assert_eq!(steps[1].slot_mapping, [13, -1]);
        assert!(steps.iter().all(|s| s.token_ids == [0, 0]));
    }
}
