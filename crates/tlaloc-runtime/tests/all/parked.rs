//! Parked sequences: a sequence kept, pages and tokens, between requests and continued by a
//! later one — checked against references that see only the plain token list, so a lost or
//! overwritten page, or a continuation that prefills the wrong tokens, changes the tokens.

use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::scheduler::{ScheduledStep, Scheduler};
use tlaloc_runtime::{
    CompileMode, Engine, EntryKind, GenerateRequest, ModelExecutor, Refusal, SequenceControl,
};

use crate::fake::{FakeModel, grid, reference_generate};
use crate::model_runs::options;
use crate::streams::{collect_ids, submit_all};
use crate::toy;

pub fn in_sequence(prompt: Vec<u32>, max_tokens: usize, key: u64, park: bool) -> GenerateRequest {
    GenerateRequest {
        sequence: Some(SequenceControl { key, park }),
        ..GenerateRequest::greedy(prompt, max_tokens)
    }
}

/// Runs the scheduler to the end; returns the tokens per request id and the steps it ran.
pub fn run_to_end(
    s: &mut Scheduler,
    model: &mut FakeModel,
) -> (Vec<(u64, u32)>, Vec<ScheduledStep>) {
    let (mut tokens, mut steps) = (Vec::new(), Vec::new());
    while s.has_work() {
        let step = s.schedule().unwrap().expect("a step");
        let out = model.step(&step.entry, &step.inputs).unwrap();
        for u in s.complete(&step, &out).unwrap() {
            tokens.push((u.id, u.sampled.token));
        }
        steps.push(step);
    }
    (tokens, steps)
}

pub fn of(tokens: &[(u64, u32)], id: u64) -> Vec<u32> {
    tokens
        .iter()
        .filter(|(i, _)| *i == id)
        .map(|(_, t)| *t)
        .collect()
}

/// Tokens the prefill steps wrote to the pools (live slots).
pub fn prefilled(steps: &[ScheduledStep]) -> usize {
    steps
        .iter()
        .filter(|s| s.entry.kind == EntryKind::Prefill)
        .map(|s| s.inputs.slot_mapping.iter().filter(|&&x| x >= 0).count())
        .sum()
}

#[test]
fn a_continued_sequence_reuses_its_pages_and_prefills_only_the_new_tokens() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[32, 64]), 4, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let first: Vec<u32> = vec![5, 9, 14, 2, 77, 31];
    s.add(1, in_sequence(first.clone(), 5, 7, true)).unwrap();
    let (tokens, _) = run_to_end(&mut s, &mut model);
    let out1 = of(&tokens, 1);
    assert_eq!(out1, reference_generate(&first, 5, &[]));
    let counts = s.counts();
    assert_eq!(counts.parked, 1);
    assert!(counts.pages_used > 0, "a parked sequence keeps its pages");

    let second: Vec<u32> = vec![40, 41, 42];
    s.add(2, in_sequence(second.clone(), 4, 7, false)).unwrap();
    let (tokens, steps) = run_to_end(&mut s, &mut model);
    let history: Vec<u32> = [first.as_slice(), &out1, &second].concat();
    assert_eq!(of(&tokens, 2), reference_generate(&history, 4, &[]));
    // Only turn one's last output (never fed back, so not in the pools) and the new prompt.
    assert_eq!(prefilled(&steps), 1 + second.len());
    let counts = s.counts();
    assert_eq!((counts.parked, counts.pages_used), (0, 0));
}

#[test]
fn a_parked_sequence_gives_its_pages_to_a_running_one_and_is_recomputed_on_resume() {
    // 8 allocatable pages of 4 tokens; the parked sequence holds 3, the next request needs 7.
    let mut model = FakeModel::new(grid(&[1], &[4, 8], &[32]), 4, 9);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let first: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6];
    s.add(1, in_sequence(first.clone(), 3, 11, true)).unwrap();
    let (tokens, _) = run_to_end(&mut s, &mut model);
    let out1 = of(&tokens, 1);
    assert_eq!(s.counts().pages_used, 3);

    let other: Vec<u32> = (0..20).map(|i| (i * 13 % 90) as u32).collect();
    s.add(2, GenerateRequest::greedy(other.clone(), 8)).unwrap();
    let (tokens, _) = run_to_end(&mut s, &mut model);
    assert_eq!(of(&tokens, 2), reference_generate(&other, 8, &[]));
    let counts = s.counts();
    assert_eq!(counts.parked, 1, "evicted, not forgotten");
    assert_eq!(counts.pages_used, 0);
    assert_eq!(counts.preemptions, 0, "the parked pages went first");

    let second = vec![8, 8];
    s.add(3, in_sequence(second.clone(), 3, 11, false)).unwrap();
    let (tokens, steps) = run_to_end(&mut s, &mut model);
    let history: Vec<u32> = [first.as_slice(), &out1, &second].concat();
    assert_eq!(of(&tokens, 3), reference_generate(&history, 3, &[]));
    assert_eq!(
        prefilled(&steps),
        history.len(),
        "recomputed from the start"
    );
}

#[test]
fn a_busy_sequence_is_refused_an_abort_ends_it_and_release_frees_it() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4], &[32]), 4, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.add(1, in_sequence(vec![1, 2, 3], 4, 5, true)).unwrap();
    assert_eq!(
        s.add(2, in_sequence(vec![4], 2, 5, true)),
        Err(Refusal::SequenceBusy { key: 5 })
    );
    s.abort(1).expect("queued");
    assert_eq!(
        (s.counts().parked, s.counts().pages_used),
        (0, 0),
        "an aborted request does not park its sequence"
    );

    s.add(3, in_sequence(vec![1, 2, 3], 4, 5, true)).unwrap();
    run_to_end(&mut s, &mut model);
    assert_eq!(s.counts().parked, 1);
    assert!(!s.release(6), "nothing parked under another key");
    assert!(s.release(5));
    assert_eq!((s.counts().parked, s.counts().pages_used), (0, 0));
}

#[test]
fn a_continuation_past_the_top_context_is_refused_and_the_sequence_stays_parked() {
    let mut model = FakeModel::new(grid(&[1], &[4], &[16]), 4, 16);
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.add(1, in_sequence(vec![1; 6], 4, 9, true)).unwrap();
    run_to_end(&mut s, &mut model);
    let used = s.counts().pages_used;
    assert_eq!(
        s.add(2, in_sequence(vec![2; 4], 3, 9, true)),
        Err(Refusal::ContextTooLong {
            prompt_tokens: 14,
            max_tokens: 3,
            needed: 17,
            max_context: 16
        })
    );
    assert_eq!((s.counts().parked, s.counts().pages_used), (1, used));
    // With no max_tokens the budget is what the top bucket leaves after the whole history.
    s.add(
        3,
        GenerateRequest {
            max_tokens: None,
            ..in_sequence(vec![2; 4], 1, 9, false)
        },
    )
    .unwrap();
    let (tokens, _) = run_to_end(&mut s, &mut model);
    assert_eq!(of(&tokens, 3).len(), 2);
}

/// The same on every test plugin through the engine: the K/V of the first turn stays in the
/// device pools between requests and the second turn's tokens are the reference's for the
/// whole history.
#[test]
fn a_conversation_continued_through_the_engine_matches_the_reference_on_every_plugin() {
    let (_tmp, dir) = toy::temp(64);
    for plugin in test_plugin_paths() {
        let engine = Engine::load(&dir, options(&plugin, None, CompileMode::Eager)).unwrap();
        let turns: [Vec<u32>; 3] = [vec![3, 14, 15, 9, 2, 6, 5], vec![35, 8], vec![9, 7, 9]];
        let mut history = Vec::new();
        for (i, turn) in turns.iter().enumerate() {
            let park = i + 1 < turns.len();
            let [rx] = submit_all(&engine, [in_sequence(turn.clone(), 6, 42, park)])
                .try_into()
                .unwrap();
            let (ids, _) = collect_ids(rx);
            history.extend_from_slice(turn);
            assert_eq!(
                ids,
                toy::reference_generate(&history, 6),
                "{} turn {i}",
                plugin.display()
            );
            history.extend_from_slice(&ids);
        }
        let stats = engine.stats();
        assert_eq!((stats.parked, stats.kv_pages_used), (0, 0));
        // A parked sequence released by key gives its pages back.
        let [rx] = submit_all(&engine, [in_sequence(vec![1, 2, 3], 2, 43, true)])
            .try_into()
            .unwrap();
        collect_ids(rx);
        assert!(engine.stats().kv_pages_used > 0);
        engine.release_sequence(43);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while engine.stats().kv_pages_used > 0 {
            assert!(std::time::Instant::now() < deadline, "release never freed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        engine.shutdown();
    }
}
