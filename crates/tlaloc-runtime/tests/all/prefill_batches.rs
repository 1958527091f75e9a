//! Prompts prefilled together and prefill alternating with decode, over the fake model: which
//! rows a prefill step packs, on which entry, within which token budget, and what every row
//! produces. The fake model reads each row's context back from its own pools and refuses a live
//! write into the scratch page or outside the row's pages, so a dead row that wrote anything, or
//! two rows that crossed, change the tokens against the reference, which sees only the plain
//! token lists.

use std::collections::HashMap;

use tlaloc_artifact::StepInput;
use tlaloc_runtime::scheduler::{ScheduledStep, Scheduler};
use tlaloc_runtime::{EntryKind, GenerateRequest, ModelExecutor};

use crate::fake::{FakeModel, VOCAB, grid, reference_generate};

const BLOCK: usize = 4;

fn tokens(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|k| (k * 31 + salt * 13 + 7) % VOCAB as u32)
        .collect()
}

/// Decode batches 1, 4; prefill batches 1, 2, 4 of chunks 4 and 8; contexts 16 and 32.
fn model() -> FakeModel {
    FakeModel::new(
        grid(&[1, 4], &[4, 8], &[16, 32]).prefill_batches(&[1, 2, 4]),
        BLOCK,
        1 + 4 * 32 / BLOCK,
    )
}

/// Runs steps until nothing is left; returns every step and each request's tokens in order.
fn run_all(
    s: &mut Scheduler,
    model: &mut FakeModel,
) -> (Vec<ScheduledStep>, HashMap<u64, Vec<u32>>) {
    let mut steps = Vec::new();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    while s.has_work() {
        let step = s.schedule().unwrap().expect("a step while there is work");
        let output = model.step(&step.entry, &step.inputs).unwrap();
        for u in s.complete(&step, &output).unwrap() {
            out.entry(u.id).or_default().push(u.sampled.token);
        }
        check_dead_rows(&step);
        steps.push(step);
    }
    (steps, out)
}

/// Every row past the live ones, and every token past a live row's own, holds the step
/// contract's padding value.
fn check_dead_rows(step: &ScheduledStep) {
    let (b, t) = (step.entry.batch, step.entry.tokens);
    let cols = step.entry.context / BLOCK;
    let inputs = &step.inputs;
    for r in 0..b {
        let live = step.rows.get(r).map_or(0, |row| row.tokens);
        for k in live..t {
            assert_eq!(inputs.token_ids[r * t + k], StepInput::TokenIds.padding());
            assert_eq!(inputs.positions[r * t + k], StepInput::Positions.padding());
            assert_eq!(
                inputs.slot_mapping[r * t + k],
                StepInput::SlotMapping.padding(),
                "{}: row {r} token {k} writes",
                step.entry
            );
        }
        if r >= step.rows.len() {
            assert_eq!(inputs.seq_lens[r], StepInput::SeqLens.padding());
            assert!(
                inputs.block_tables[r * cols..(r + 1) * cols]
                    .iter()
                    .all(|&p| p == StepInput::BlockTables.padding())
            );
        }
    }
}

/// Queues `prompts` as greedy requests of `max_new` tokens, request `i` for prompt `i`.
fn add_greedy(s: &mut Scheduler, prompts: &[Vec<u32>], max_new: usize) {
    for (i, p) in prompts.iter().enumerate() {
        s.add(i as u64, GenerateRequest::greedy(p.clone(), max_new))
            .unwrap();
    }
}

/// Every request `i` of [`add_greedy`] produced the reference's `max_new` tokens for prompt `i`.
fn assert_each_matches_the_reference(
    out: &HashMap<u64, Vec<u32>>,
    prompts: &[Vec<u32>],
    max_new: usize,
    context: &str,
) {
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            out[&(i as u64)],
            reference_generate(p, max_new, &[]),
            "{context} prompt {i}"
        );
    }
}

fn prefill_steps(steps: &[ScheduledStep]) -> impl Iterator<Item = &ScheduledStep> {
    steps.iter().filter(|s| s.entry.kind == EntryKind::Prefill)
}

#[test]
fn prompts_in_line_are_prefilled_together_and_match_each_prompt_alone() {
    // 3, 6 and 13 tokens: the oldest needs the 4-token chunk, so the first step is
    // prefill_b4_t4 with three live rows: the first whole, the others continued later.
    let prompts = [tokens(3, 1), tokens(6, 2), tokens(13, 3)];
    let mut model = model();
    let mut s = Scheduler::new(model.shape()).unwrap();
    add_greedy(&mut s, &prompts, 5);
    let (steps, out) = run_all(&mut s, &mut model);
    let first = &steps[0];
    assert_eq!(first.entry.kind, EntryKind::Prefill);
    assert_eq!((first.entry.batch, first.entry.tokens), (4, 4));
    let rows: Vec<(u64, usize, bool)> = first
        .rows
        .iter()
        .map(|r| (r.id, r.tokens, r.emits))
        .collect();
    assert_eq!(rows, vec![(0, 3, true), (1, 4, false), (2, 4, false)]);
    // Each row holds its own prompt's first tokens at their positions, in row order.
    for (r, (p, row)) in prompts.iter().zip(&first.rows).enumerate() {
        for (k, &token) in p.iter().take(row.tokens).enumerate() {
            assert_eq!(first.inputs.positions[r * 4 + k], k as i32);
            assert_eq!(first.inputs.token_ids[r * 4 + k], token as i32);
        }
    }
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            out[&(i as u64)],
            reference_generate(p, 5, &[]),
            "prompt {i}"
        );
    }
    assert!(prefill_steps(&steps).any(|s| s.rows.len() > 1));
    assert_eq!(s.counts().pages_used, 0);

    // The same prompts each alone, with prefill batch 1 only: the same tokens.
    for (i, p) in prompts.iter().enumerate() {
        let mut alone =
            FakeModel::new(grid(&[1, 4], &[4, 8], &[16, 32]), BLOCK, 1 + 4 * 32 / BLOCK);
        let mut s = Scheduler::new(alone.shape()).unwrap();
        s.add(9, GenerateRequest::greedy(p.clone(), 5)).unwrap();
        let (steps, got) = run_all(&mut s, &mut alone);
        assert!(prefill_steps(&steps).all(|s| s.entry.batch == 1));
        assert_eq!(got[&9], out[&(i as u64)], "prompt {i} alone");
    }
}

#[test]
fn a_mix_of_lengths_that_need_different_chunks_is_packed_and_every_row_ends_right() {
    // Lengths from 2 to 29: some fit one 4-token chunk, some one 8-token chunk, some take
    // several. The oldest in line decides the chunk: 3 tokens give a first step of 4-token
    // rows, and the 9-token prompt then leads 8-token rows.
    let lengths = [3, 9, 29, 5, 17, 8, 2, 12];
    let prompts: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| tokens(n, i as u32 + 10))
        .collect();
    let mut model = model();
    let mut s = Scheduler::new(model.shape()).unwrap();
    add_greedy(&mut s, &prompts, 3);
    let (steps, out) = run_all(&mut s, &mut model);
    assert_each_matches_the_reference(&out, &prompts, 3, "");
    let shapes: std::collections::BTreeSet<(usize, usize)> = prefill_steps(&steps)
        .map(|s| (s.entry.batch, s.entry.tokens))
        .collect();
    assert!(shapes.iter().any(|&(b, t)| b > 1 && t == 8), "{shapes:?}");
    assert!(shapes.iter().any(|&(b, t)| b > 1 && t == 4), "{shapes:?}");
    // Every token was processed exactly once (prompt and output but the last output; a
    // prompt with one token left goes through a decode row), nothing preempted.
    let mut processed = vec![0; prompts.len()];
    for step in &steps {
        for row in &step.rows {
            assert!(row.tokens <= step.entry.tokens);
            processed[row.id as usize] += row.tokens;
        }
    }
    let expected: Vec<usize> = lengths.iter().map(|n| n + 3 - 1).collect();
    assert_eq!(processed, expected);
    assert_eq!(s.counts().preemptions, 0);
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn the_token_budget_bounds_every_prefill_step_and_the_smallest_entry_always_runs() {
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| tokens(10 + i, i as u32 + 20)).collect();
    // Budget -> the prefill shapes it allows (batch x tokens <= budget), the smallest entry
    // (1 x 4) when nothing else fits.
    for budget in [1, 4, 8, 12, 16, 32, 512] {
        let mut model = model();
        let mut s = Scheduler::new(model.shape()).unwrap();
        s.set_max_prefill_tokens(budget);
        add_greedy(&mut s, &prompts, 2);
        let (steps, out) = run_all(&mut s, &mut model);
        assert_each_matches_the_reference(&out, &prompts, 2, &format!("budget {budget}"));
        let largest = prefill_steps(&steps)
            .map(|s| s.entry.batch * s.entry.tokens)
            .max()
            .unwrap();
        assert!(
            largest <= budget.max(4),
            "budget {budget}: a step of {largest} tokens"
        );
        // The budget is used: the largest step is the largest shape within it that the rows
        // in line needed (four prompts of 10 to 13 tokens want the 8-token chunk).
        let expected = match budget {
            1..=7 => 4,
            8..=15 => 8,
            16..=31 => 16,
            _ => 32,
        };
        assert_eq!(largest, expected, "budget {budget}");
        assert_eq!(s.counts().pages_used, 0);
    }
}

#[test]
fn a_running_stream_keeps_receiving_tokens_between_the_chunks_of_a_long_prompt() {
    let short = tokens(3, 40);
    let long = tokens(30, 41);
    let max_tokens = 12;
    let mut model = model();
    let mut s = Scheduler::new(model.shape()).unwrap();
    // One prompt at a time, 4 tokens per step: the long prompt takes 8 prefill steps.
    s.set_max_prefill_tokens(4);
    s.add(1, GenerateRequest::greedy(short.clone(), max_tokens))
        .unwrap();
    // Until the short one decodes.
    let mut got: HashMap<u64, Vec<u32>> = HashMap::new();
    let step = s.schedule().unwrap().unwrap();
    let output = model.step(&step.entry, &step.inputs).unwrap();
    for u in s.complete(&step, &output).unwrap() {
        got.entry(u.id).or_default().push(u.sampled.token);
    }
    s.add(2, GenerateRequest::greedy(long.clone(), 2)).unwrap();
    let (steps, rest) = run_all(&mut s, &mut model);
    for (id, tokens) in rest {
        got.entry(id).or_default().extend(tokens);
    }
    // Its ids are those of the stream run with nothing else, and the long prompt's too.
    assert_eq!(got[&1], reference_generate(&short, max_tokens, &[]));
    assert_eq!(got[&2], reference_generate(&long, 2, &[]));
    // Between any two prefill steps of the long prompt, the stream got a token.
    let chunks: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.entry.kind == EntryKind::Prefill && s.rows.iter().any(|r| r.id == 2))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(chunks.len(), 30usize.div_ceil(4), "{chunks:?}");
    for pair in chunks.windows(2) {
        let between = &steps[pair[0] + 1..pair[1]];
        assert!(
            between
                .iter()
                .any(|s| s.rows.iter().any(|r| r.id == 1 && r.emits)),
            "no token for the running stream between steps {} and {}",
            pair[0],
            pair[1]
        );
    }
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn prompts_prefilled_together_still_skip_their_cached_prefix() {
    let mut model = model();
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.set_prefix_cache(Some(b"the fake model"));
    let shared = tokens(12, 50);
    let first = [shared.clone(), tokens(2, 51)].concat();
    s.add(0, GenerateRequest::greedy(first.clone(), 2)).unwrap();
    let (_, out) = run_all(&mut s, &mut model);
    assert_eq!(out[&0], reference_generate(&first, 2, &[]));

    // Two prompts that start with the 12 cached tokens (three full blocks) arrive together:
    // one step prefills both, each from position 12.
    let prompts = [
        [shared.clone(), tokens(3, 52)].concat(),
        [shared.clone(), tokens(4, 53)].concat(),
    ];
    for (i, p) in prompts.iter().enumerate() {
        s.add(1 + i as u64, GenerateRequest::greedy(p.clone(), 3))
            .unwrap();
    }
    let (steps, out) = run_all(&mut s, &mut model);
    let first = &steps[0];
    assert_eq!(first.entry.kind, EntryKind::Prefill);
    assert_eq!(first.rows.len(), 2, "{:?}", first.rows);
    let t = first.entry.tokens;
    for (r, p) in prompts.iter().enumerate() {
        assert_eq!(first.rows[r].tokens, p.len() - 12);
        assert_eq!(first.inputs.positions[r * t], 12);
        assert_eq!(first.inputs.token_ids[r * t], p[12] as i32);
    }
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            out[&(1 + i as u64)],
            reference_generate(p, 3, &[]),
            "prompt {i}"
        );
    }
    assert!(s.counts().prefix_cache.hit_tokens >= 24);
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn prompts_that_arrive_together_with_a_shared_prefix_compute_it_once() {
    let mut model = model();
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.set_prefix_cache(Some(b"the fake model"));
    // Three full blocks shared, nothing cached yet: the second waits for the first to compute
    // them instead of computing them beside it in the same steps.
    let shared = tokens(12, 60);
    let prompts = [
        [shared.clone(), tokens(3, 61)].concat(),
        [shared.clone(), tokens(4, 62)].concat(),
    ];
    add_greedy(&mut s, &prompts, 3);
    let (steps, out) = run_all(&mut s, &mut model);
    assert_each_matches_the_reference(&out, &prompts, 3, "");
    let prefilled = |id: u64| -> usize {
        prefill_steps(&steps)
            .flat_map(|s| &s.rows)
            .filter(|r| r.id == id)
            .map(|r| r.tokens)
            .sum()
    };
    assert_eq!(prefilled(0), prompts[0].len());
    assert_eq!(prefilled(1), prompts[1].len() - 12);
    let stats = s.counts().prefix_cache;
    assert_eq!(
        (stats.queries, stats.hits, stats.hit_tokens),
        (2, 1, 12),
        "{stats:?}"
    );
    assert_eq!(s.counts().pages_used, 0);
}
