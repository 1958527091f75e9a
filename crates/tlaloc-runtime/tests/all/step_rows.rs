//! The step executor driven as an external scheduler would: the caller owns the pages (in an
//! order of its own, not the block manager's), prefills in chunks of lengths the ladder does not
//! have, and decodes rows of different lengths together — checked against the references,
//! which see only the plain token lists.

use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::{CompileMode, Model, ModelExecutor, StepError, StepExecutor, StepRow};

use crate::fake::{FakeModel, VOCAB, grid, reference_next};
use crate::model_runs::options;
use crate::toy;

/// Three sequences on caller-chosen pages; prompts prefilled in uneven chunks in the same
/// step as other rows decode, then all decoded together. Returns each sequence's tokens.
fn drive<E: ModelExecutor>(
    steps: &mut StepExecutor<E>,
    next: impl Fn(&[u32]) -> u32,
    vocab: u32,
) -> Vec<Vec<u32>> {
    let pages: [Vec<u32>; 3] = [vec![9, 3, 7, 12], vec![2, 14], vec![5, 1, 11, 4]];
    let mut seqs: Vec<Vec<u32>> = vec![
        (0..11).map(|i| (i * 7 + 1) % vocab).collect(),
        vec![4, 8, 15],
        (0..6).map(|i| (i * 5 + 2) % vocab).collect(),
    ];
    let mut done = [0usize; 3];
    // Step 1: sequence 0 prefills 5, sequence 1 all 3 (wants logits), sequence 2 prefills 6.
    // Step 2: sequence 0 prefills the other 6 while 1 and 2 decode. Then all decode, 4 steps.
    let plan: [[usize; 3]; 6] = [
        [5, 3, 6],
        [6, 1, 1],
        [1, 1, 1],
        [1, 1, 1],
        [1, 1, 1],
        [1, 1, 1],
    ];
    for (k, counts) in plan.iter().enumerate() {
        let rows: Vec<StepRow> = (0..3)
            .map(|s| StepRow {
                token_ids: seqs[s][done[s]..done[s] + counts[s]].to_vec(),
                start: done[s],
                block_ids: pages[s].clone(),
                want_logits: s == 1,
            })
            .collect();
        let out = steps
            .execute(&rows)
            .unwrap_or_else(|e| panic!("step {k}: {e}"));
        for s in 0..3 {
            done[s] += counts[s];
            let reference = next(&seqs[s][..done[s]]);
            assert_eq!(out[s].next_token, reference, "step {k} sequence {s}");
            let logits = out[s].logits.as_ref();
            assert_eq!(logits.is_some(), s == 1, "logits only where asked");
            if let Some(l) = logits {
                let argmax = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
                assert_eq!(argmax as u32, reference, "step {k}: logits disagree");
            }
            // The caller feeds the output back as the next decode token.
            if done[s] == seqs[s].len() {
                seqs[s].push(out[s].next_token);
            }
        }
    }
    seqs
}

#[test]
fn rows_from_an_external_scheduler_match_the_reference() {
    let model = FakeModel::new(grid(&[1, 2, 4], &[4, 8], &[16, 32]), 4, 16);
    let mut steps = StepExecutor::new(model);
    drive(&mut steps, reference_next, VOCAB as u32);
}

#[test]
fn rows_from_an_external_scheduler_match_the_reference_on_every_plugin() {
    let (_tmp, dir) = toy::temp(16);
    for plugin in test_plugin_paths() {
        let model = Model::load(&dir, &options(&plugin, None, CompileMode::Lazy)).unwrap();
        let mut steps = StepExecutor::new(model);
        drive(&mut steps, toy::reference_next, toy::VOCAB as u32);
    }
}

#[test]
fn bad_rows_are_refused_by_name_before_anything_runs() {
    let model = FakeModel::new(grid(&[1, 2], &[4], &[16]), 4, 8);
    let mut steps = StepExecutor::new(model);
    let row = |tokens: Vec<u32>, start, block_ids: Vec<u32>| StepRow {
        token_ids: tokens,
        start,
        block_ids,
        want_logits: false,
    };
    let err = |rows: &[StepRow], steps: &mut StepExecutor<FakeModel>| {
        steps.execute(rows).unwrap_err().to_string()
    };
    let e = err(&[row(vec![1], 0, vec![0])], &mut steps);
    assert!(
        e.contains("block id 0 refused") && e.contains("scratch"),
        "{e}"
    );
    let e = err(
        &[row(vec![1], 0, vec![2]), row(vec![1], 0, vec![8])],
        &mut steps,
    );
    assert!(e.starts_with("row 1: block id 8 refused"), "{e}");
    let e = err(&[row(vec![], 0, vec![2])], &mut steps);
    assert!(e.contains("row 0 has no tokens"), "{e}");
    let e = err(&[row(vec![1, 2], 15, vec![1, 2, 3, 4, 5])], &mut steps);
    assert!(
        e.contains("context of 17 tokens exceeds the largest context bucket 16"),
        "{e}"
    );
    // Refused before the first row runs: the fake would fail a step that wrote outside pages.
    assert!(matches!(
        steps.execute(&[row(vec![1], 0, vec![1]), row(vec![1, 2, 3], 3, vec![2])]),
        Err(StepError::TooFewBlocks {
            row: 1,
            context: 6,
            ..
        })
    ));
}
