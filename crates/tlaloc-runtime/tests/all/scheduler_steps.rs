//! The scheduler's step inputs, checked field by field.

use tlaloc_runtime::Refusal;
use tlaloc_runtime::scheduler::Scheduler;
use tlaloc_runtime::{EntryKind, GenerateRequest, ModelExecutor};

use crate::fake::{FakeModel, grid, reference_next};

fn run_step(s: &mut Scheduler, model: &mut FakeModel) -> tlaloc_runtime::scheduler::ScheduledStep {
    let step = s.schedule().unwrap().expect("a step");
    let out = model.step(&step.entry, &step.inputs).unwrap();
    s.complete(&step, &out).unwrap();
    step
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_that_continue_each_other() {
    let bs = 4;
    let mut model = FakeModel::new(grid(&[1, 4], &[4, 8], &[16, 32]), bs, 16);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let prompt: Vec<u32> = (0..19).map(|i| (i * 7 % 90 + 3) as u32).collect();
    s.add(1, GenerateRequest::greedy(prompt.clone(), 3))
        .unwrap();

    // 19 tokens: chunks of 8, 8, then 3 in a T=4 entry (one padding token).
    let expected = [(8, 0, 16), (8, 8, 16), (4, 16, 32)];
    let mut table = Vec::new();
    for (n, &(t, start, c)) in expected.iter().enumerate() {
        let step = run_step(&mut s, &mut model);
        assert_eq!(step.entry.kind, EntryKind::Prefill, "chunk {n}");
        assert_eq!(
            (step.entry.batch, step.entry.tokens, step.entry.context),
            (1, t, c),
            "chunk {n}"
        );
        let real = (prompt.len() - start).min(t);
        let cols = c / bs;
        let row_table = &step.inputs.block_tables[..cols];
        for k in 0..t {
            if k < real {
                let pos = start + k;
                assert_eq!(step.inputs.token_ids[k], prompt[pos] as i32);
                assert_eq!(step.inputs.positions[k], pos as i32);
                let page = row_table[pos / bs];
                assert!(page > 0, "live token {pos} in the scratch page");
                assert_eq!(
                    step.inputs.slot_mapping[k],
                    page * bs as i32 + (pos % bs) as i32
                );
            } else {
                assert_eq!(step.inputs.token_ids[k], 0);
                assert_eq!(step.inputs.positions[k], 0);
                assert_eq!(step.inputs.slot_mapping[k], -1);
            }
        }
        assert_eq!(step.inputs.seq_lens[0], (start + real) as i32);
        // Earlier chunks' pages stay where they were.
        let used: Vec<i32> = row_table.iter().copied().take_while(|p| *p != 0).collect();
        assert!(used.starts_with(&table), "chunk {n} moved earlier pages");
        table = used;
        assert_eq!(table.len(), (start + real).div_ceil(bs));
    }
    // The last chunk emitted the first token; the next steps decode.
    let step = run_step(&mut s, &mut model);
    assert_eq!(step.entry.kind, EntryKind::Decode);
    assert_eq!(step.inputs.positions[0], 19);
    let mut tokens = prompt.clone();
    tokens.push(reference_next(&tokens));
    assert_eq!(step.inputs.token_ids[0], tokens[19] as i32);
    run_step(&mut s, &mut model);
    assert!(!s.has_work());
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn padded_rows_follow_the_padding_contract_exactly() {
    let bs = 4;
    let mut model = FakeModel::new(grid(&[1, 2, 8], &[8], &[16, 32]), bs, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    for id in 0..3u64 {
        let prompt = vec![5 + id as u32; 3 + 4 * id as usize];
        s.add(id, GenerateRequest::greedy(prompt, 10)).unwrap();
    }
    let mut decode = None;
    for _ in 0..10 {
        let step = run_step(&mut s, &mut model);
        if step.entry.kind == EntryKind::Decode && step.rows.len() == 3 {
            decode = Some(step);
            break;
        }
    }
    let step = decode.expect("a decode step of all three sequences");
    // Three rows round up to the B=8 bucket; the longest row (11 prompt + 1) fits C=16.
    assert_eq!((step.entry.batch, step.entry.context), (8, 16));
    let cols = step.entry.context / bs;
    for row in 3..8 {
        assert_eq!(step.inputs.token_ids[row], 0, "row {row} tokenIds");
        assert_eq!(step.inputs.positions[row], 0, "row {row} positions");
        assert_eq!(step.inputs.seq_lens[row], 1, "row {row} seqLens");
        assert_eq!(step.inputs.slot_mapping[row], -1, "row {row} slotMapping");
        assert!(
            step.inputs.block_tables[row * cols..(row + 1) * cols]
                .iter()
                .all(|p| *p == 0),
            "row {row} blockTables"
        );
    }
    for row in 0..3 {
        let len = step.inputs.seq_lens[row];
        assert_eq!(
            step.inputs.positions[row],
            len - 1,
            "live row {row} decodes its last token"
        );
        assert!(step.inputs.slot_mapping[row] >= bs as i32);
    }
}

#[test]
fn decode_takes_the_smallest_buckets_that_fit() {
    let bs = 4;
    let mut model = FakeModel::new(grid(&[1, 2, 4], &[4], &[8, 16, 32]), bs, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.add(1, GenerateRequest::greedy(vec![1, 2], 12)).unwrap();
    let mut seen = Vec::new();
    while s.has_work() {
        let step = run_step(&mut s, &mut model);
        if step.entry.kind == EntryKind::Decode {
            seen.push((
                step.inputs.seq_lens[0] as usize,
                step.entry.batch,
                step.entry.context,
            ));
        }
    }
    for (len, batch, context) in seen {
        assert_eq!(batch, 1);
        let smallest = [8, 16, 32].into_iter().find(|c| *c >= len).unwrap();
        assert_eq!(context, smallest, "length {len}");
    }
}

#[test]
fn requests_past_the_top_context_bucket_are_refused_by_name() {
    let model = FakeModel::new(grid(&[1], &[4], &[16, 32]), 4, 64);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let err = s
        .add(1, GenerateRequest::greedy(vec![1; 30], 3))
        .unwrap_err();
    assert_eq!(
        err,
        Refusal::ContextTooLong {
            prompt_tokens: 30,
            max_tokens: 3,
            needed: 33,
            max_context: 32
        }
    );
    assert!(
        err.to_string().contains("top context bucket of 32"),
        "{err}"
    );
    assert!(matches!(
        s.add(2, GenerateRequest::greedy(vec![1; 33], 1)),
        Err(Refusal::ContextTooLong { .. })
    ));
    assert_eq!(
        s.add(3, GenerateRequest::greedy(vec![], 1)),
        Err(Refusal::EmptyPrompt)
    );
    assert!(matches!(
        s.add(4, GenerateRequest::greedy(vec![1, 500], 1)),
        Err(Refusal::TokenOutOfVocabulary {
            token: 500,
            index: 1,
            ..
        })
    ));
    assert_eq!(
        s.add(5, GenerateRequest::greedy(vec![1], 0)),
        Err(Refusal::ZeroMaxTokens)
    );
    // With no max_tokens the budget is what the top bucket leaves.
    assert_eq!(
        GenerateRequest {
            max_tokens: None,
            ..GenerateRequest::greedy(vec![1; 20], 1)
        }
        .validate(model.shape())
        .map(|v| v.max_tokens()),
        Ok(12)
    );
    assert!(!s.has_work());
}

#[test]
fn a_pool_that_cannot_hold_one_sequence_is_refused_by_name() {
    let model = FakeModel::new(grid(&[1], &[4], &[64]), 4, 5);
    Scheduler::new(model.shape()).unwrap();
    let err = GenerateRequest::greedy(vec![1; 10], 10)
        .validate(model.shape())
        .unwrap_err();
    assert_eq!(
        err,
        Refusal::PoolTooSmall {
            needed: 20,
            pages: 5,
            allocatable: 4
        }
    );
}

#[test]
fn a_greedy_decode_chains_steps_one_token_further_and_writes_nothing_past_a_budget() {
    let bs = 4;
    let mut model = FakeModel::new(grid(&[1, 2], &[4], &[32]), bs, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.set_max_decode_chain(4);
    let (long, short) = (vec![5, 6, 7], vec![9, 8]);
    s.add(1, GenerateRequest::greedy(long.clone(), 10)).unwrap();
    s.add(2, GenerateRequest::greedy(short.clone(), 2)).unwrap();
    let mut out: [Vec<u32>; 2] = Default::default();
    fn collect(out: &mut [Vec<u32>; 2], updates: Vec<tlaloc_runtime::request::TokenUpdate>) {
        for u in updates {
            out[u.id as usize - 1].push(u.sampled.token);
        }
    }
    // Prefill 1, a decode of 1 while 2 waits (never chained: it would hold 2's prompt back),
    // prefill 2.
    for kind in [EntryKind::Prefill, EntryKind::Decode, EntryKind::Prefill] {
        let step = s.schedule().unwrap().expect("a step");
        assert_eq!(step.entry.kind, kind);
        assert!(step.chain.is_empty(), "{kind:?} step chained");
        let o = model.step(&step.entry, &step.inputs).unwrap();
        collect(&mut out, s.complete(&step, &o).unwrap());
    }
    // Both decode: 1 has 5 tokens (2 generated, 8 to go), 2 has 3 (1 generated, 1 to go).
    let step = s.schedule().unwrap().expect("a step");
    assert_eq!(step.entry.kind, EntryKind::Decode);
    assert_eq!(step.chain.len(), 3, "four steps in all");
    let cols = step.entry.context / bs;
    for (k, inputs) in step.chain.iter().enumerate().map(|(i, x)| (i + 1, x)) {
        let pos = 4 + k;
        assert_eq!(inputs.positions[0], pos as i32, "step {k}");
        assert_eq!(inputs.seq_lens[0], pos as i32 + 1, "step {k}");
        let page = inputs.block_tables[pos / bs];
        assert!(page > 0, "step {k}: position {pos} has no page");
        assert_eq!(inputs.slot_mapping[0], page * bs as i32 + (pos % bs) as i32);
        // Row 2's budget ended with step 0: it writes nothing and keeps its last inputs.
        assert_eq!(inputs.slot_mapping[1], -1, "step {k}");
        assert_eq!(inputs.positions[1], step.inputs.positions[1]);
        assert_eq!(inputs.seq_lens[1], step.inputs.seq_lens[1]);
        assert_eq!(inputs.block_tables, step.inputs.block_tables);
        assert!(!inputs.want_logits);
    }
    assert_eq!(step.inputs.block_tables.len(), 2 * cols);
    let mut all = vec![step.inputs.clone()];
    all.extend(step.chain.iter().cloned());
    for o in model.decode_chain(&step.entry, &all).unwrap() {
        collect(&mut out, s.complete(&step, &o).unwrap());
    }
    // 1 gained four tokens, 2 only the one its budget allowed.
    assert_eq!(out[0].len(), 6);
    assert_eq!(out[1].len(), 2);
    while s.has_work() {
        let step = s.schedule().unwrap().expect("a step");
        let mut all = vec![step.inputs.clone()];
        all.extend(step.chain.iter().cloned());
        for o in model.decode_chain(&step.entry, &all).unwrap() {
            collect(&mut out, s.complete(&step, &o).unwrap());
        }
    }
    assert_eq!(out[0], crate::fake::reference_generate(&long, 10, &[]));
    assert_eq!(out[1], crate::fake::reference_generate(&short, 2, &[]));
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn rows_that_need_logits_are_never_chained() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4], &[32]), 4, 32);
    for request in [
        GenerateRequest {
            logprobs: Some(2),
            ..GenerateRequest::greedy(vec![1, 2, 3], 8)
        },
        GenerateRequest {
            sampling: tlaloc_runtime::SamplingParams {
                temperature: 0.7,
                seed: Some(3),
                ..tlaloc_runtime::SamplingParams::greedy()
            },
            ..GenerateRequest::greedy(vec![1, 2, 3], 8)
        },
    ] {
        let mut s = Scheduler::new(model.shape()).unwrap();
        s.set_max_decode_chain(8);
        s.add(1, GenerateRequest::greedy(vec![4, 5], 8)).unwrap();
        s.add(2, request).unwrap();
        while s.has_work() {
            let step = s.schedule().unwrap().expect("a step");
            assert!(
                step.chain.is_empty(),
                "a chain with a row that needs logits"
            );
            let o = model.step(&step.entry, &step.inputs).unwrap();
            s.complete(&step, &o).unwrap();
        }
    }
}

#[test]
fn a_larger_decode_bucket_measured_faster_is_used_after_each_is_tried() {
    let mut model = FakeModel::new(grid(&[1, 2, 4, 8, 16], &[4], &[32, 64]), 4, 64);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let prompt = vec![3, 1, 4];
    s.add(1, GenerateRequest::greedy(prompt.clone(), 28))
        .unwrap();
    // Every bucket's first step is slow (one-time work); it must not count.
    let mut first = std::collections::HashSet::new();
    let mut cost = |batch: usize| {
        if first.insert(batch) {
            return std::time::Duration::from_millis(500);
        }
        std::time::Duration::from_millis(match batch {
            1 => 10,
            2 => 4,
            _ => 1,
        })
    };
    let (mut batches, mut out) = (Vec::new(), Vec::new());
    while s.has_work() {
        let step = s.schedule().unwrap().expect("a step");
        let o = model.step(&step.entry, &step.inputs).unwrap();
        if step.entry.kind == EntryKind::Decode {
            assert_eq!(step.entry.context, 32, "the context bucket never grows");
            batches.push(step.entry.batch);
            s.observe_decode_cost(step.entry, cost(step.entry.batch));
        }
        out.extend(
            s.complete(&step, &o)
                .unwrap()
                .iter()
                .map(|u| u.sampled.token),
        );
    }
    // The smallest bucket runs 16 steps, then the next one up is tried for two (4, 8 and 16,
    // which would be faster still, never are); then the faster of the two.
    let tried = tlaloc_runtime::bucket::DECODE_STEPS_BEFORE_TRYING as usize;
    assert_eq!(tried, 16);
    assert!(batches[..tried].iter().all(|&b| b == 1), "{batches:?}");
    assert_eq!(&batches[tried..tried + 2], &[2, 2], "{batches:?}");
    assert!(batches[tried + 2..].iter().all(|&b| b == 2), "{batches:?}");
    assert_eq!(batches.len(), 27);
    assert_eq!(out, crate::fake::reference_generate(&prompt, 28, &[]));
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn without_exploration_decode_keeps_the_smallest_bucket() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4], &[32]), 4, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.set_decode_exploration(false);
    s.add(1, GenerateRequest::greedy(vec![3, 1, 4], 8)).unwrap();
    while s.has_work() {
        let step = s.schedule().unwrap().expect("a step");
        let o = model.step(&step.entry, &step.inputs).unwrap();
        if step.entry.kind == EntryKind::Decode {
            assert_eq!(step.entry.batch, 1);
            // Batch 2 would look ten times faster, were it tried.
            s.observe_decode_cost(step.entry, std::time::Duration::from_millis(10));
            let mut other = step.entry;
            other.batch = 2;
            s.observe_decode_cost(other, std::time::Duration::from_millis(1));
            s.observe_decode_cost(other, std::time::Duration::from_millis(1));
        }
        s.complete(&step, &o).unwrap();
    }
}
