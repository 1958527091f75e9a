//! Ladder selection against a brute-force search over the ladder's points, refusals over the
//! top, and the derivation rule for ladders built from export options.

use tlaloc_artifact::{
    Artifact, EntryKind, Ladder, LadderError, LadderOptions, LadderPoint, MANIFEST_FILE,
};

use crate::fixture;

/// Options for batches up to `max_batch` and contexts up to `max_context` in blocks of
/// `block_size`, a pool of `num_blocks` and the given prefill chunks; the buckets are derived.
fn options(
    max_batch: usize,
    max_context: usize,
    block_size: usize,
    num_blocks: usize,
    prefill_chunks: Vec<usize>,
) -> LadderOptions {
    LadderOptions {
        num_blocks,
        ..LadderOptions::full_pool(max_batch, max_context, block_size, prefill_chunks)
    }
}

/// The smallest point of `kind` (by batch, then tokens, then context) that covers the request.
fn brute_force(
    ladder: &Ladder,
    kind: EntryKind,
    batch: usize,
    tokens: usize,
    context: usize,
) -> Option<LadderPoint> {
    ladder
        .points()
        .into_iter()
        .filter(|p| {
            p.kind == kind && p.batch >= batch && p.tokens >= tokens && p.context >= context
        })
        .min_by_key(|p| (p.batch, p.tokens, p.context))
}

#[test]
fn decode_selection_rounds_up_to_the_smallest_covering_point() {
    let ladder = options(6, 320, 16, 1 + 6 * 20, vec![32, 128])
        .ladder()
        .expect("ladder");
    for batch in 1..=ladder.max_batch {
        for context in 1..=ladder.max_context {
            let expected = brute_force(&ladder, EntryKind::Decode, batch, 1, context)
                .expect("a covering point exists below the top");
            assert_eq!(ladder.decode_entry(batch, context), Ok(expected));
        }
    }
}

#[test]
fn prefill_selection_rounds_up_to_the_smallest_covering_point() {
    let ladder = fixture::ladder();
    for tokens in 1..=ladder.max_prefill_chunk() {
        for context in tokens..=ladder.max_context {
            let expected = brute_force(&ladder, EntryKind::Prefill, 1, tokens, context)
                .expect("a covering point exists below the top");
            assert_eq!(ladder.prefill_entry(tokens, context), Ok(expected));
        }
    }
}

#[test]
fn requests_over_the_top_are_refused_by_name_not_clamped() {
    let ladder = fixture::ladder();
    let over = ladder.decode_entry(1, 33).unwrap_err();
    assert_eq!(
        over,
        LadderError::ContextTooLong {
            requested: 33,
            max: 32
        }
    );
    assert!(over.to_string().contains("33") && over.to_string().contains("32"));
    let refusals = [
        (
            ladder.decode_entry(3, 4),
            LadderError::BatchTooLarge {
                requested: 3,
                max: 2,
            },
        ),
        (
            ladder.prefill_entry(17, 20),
            LadderError::PrefillChunkTooLarge {
                requested: 17,
                max: 16,
            },
        ),
        (
            ladder.prefill_entry(4, 40),
            LadderError::ContextTooLong {
                requested: 40,
                max: 32,
            },
        ),
        (
            ladder.decode_entry(0, 4),
            LadderError::Empty { what: "batch" },
        ),
        (
            ladder.prefill_entry(9, 8),
            LadderError::PrefillLongerThanContext {
                tokens: 9,
                context: 8,
            },
        ),
    ];
    for (got, expected) in refusals {
        assert_eq!(got, Err(expected));
    }
}

#[test]
fn block_size_that_does_not_divide_a_context_is_refused() {
    let options = options(4, 100, 16, 64, vec![16]);
    let err = options.ladder().unwrap_err();
    assert_eq!(
        err,
        LadderError::BlockSizeDoesNotDivideContext {
            block_size: 16,
            context: 100
        }
    );
    assert!(err.to_string().contains("block size 16"), "{err}");

    let mut ladder = fixture::ladder();
    ladder.context_buckets = vec![12, 32];
    assert_eq!(
        ladder.validate(),
        Err(LadderError::BlockSizeDoesNotDivideContext {
            block_size: 8,
            context: 12
        })
    );
}

#[test]
fn malformed_ladders_are_refused_naming_the_field() {
    type Corrupt = fn(&mut Ladder);
    let cases: [(&str, Corrupt); 9] = [
        ("batchBuckets", |l| l.batch_buckets = vec![2, 1]),
        ("batchBuckets", |l| l.batch_buckets = vec![1, 1, 2]),
        ("contextBuckets", |l| l.context_buckets = vec![]),
        ("contextBuckets", |l| l.context_buckets = vec![16]),
        ("prefillChunks", |l| l.prefill_chunks = vec![8, 64]),
        ("prefillBatchBuckets", |l| l.prefill_batch_buckets = vec![]),
        ("prefillBatchBuckets", |l| {
            l.prefill_batch_buckets = vec![2, 1]
        }),
        ("prefillBatchBuckets", |l| {
            l.prefill_batch_buckets = vec![0, 1]
        }),
        // Prompts prefilled together run together: no more than maxBatch (2 here).
        ("prefillBatchBuckets", |l| {
            l.prefill_batch_buckets = vec![1, 4]
        }),
    ];
    for (field, corrupt) in cases {
        let mut ladder = fixture::ladder();
        corrupt(&mut ladder);
        match ladder.validate() {
            Err(LadderError::Malformed { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected a malformed {field}, got {other:?}"),
        }
    }
}

#[test]
fn derived_ladder_follows_the_stated_rule() {
    // Batch: powers of two below maxBatch, then maxBatch. Context: from the smallest multiple
    // of the block size >= 128, doubling while below maxContext, then maxContext.
    let ladder = options(6, 600, 40, 1 + 6 * 600 / 40, vec![128, 32, 128])
        .ladder()
        .expect("ladder");
    assert_eq!(ladder.batch_buckets, vec![1, 2, 4, 6]);
    assert_eq!(ladder.context_buckets, vec![160, 320, 600]);
    assert_eq!(ladder.prefill_chunks, vec![32, 128]);
}

#[test]
fn derived_ladder_with_an_indivisible_top_is_refused() {
    let err = options(1, 640, 48, 100, vec![16]).ladder().unwrap_err();
    assert!(matches!(
        err,
        LadderError::BlockSizeDoesNotDivideContext { context: 640, .. }
    ));
}

#[test]
fn default_options_give_a_small_ladder() {
    let options = LadderOptions::default();
    let ladder = options.ladder().expect("default ladder");
    let points = ladder.points();
    let decode = points
        .iter()
        .filter(|p| p.kind == EntryKind::Decode)
        .count();
    assert_eq!(
        decode,
        ladder.batch_buckets.len() * ladder.context_buckets.len()
    );
    // A short prompt has a chunk of its own size class: the smallest chunk is one block.
    assert_eq!(ladder.prefill_chunks[0], options.block_size);
    assert!(ladder.prefill_chunks.len() >= 2);
    assert!(points.len() <= 18, "{} entries", points.len());
    // The pool holds every row of the top batch at the top context, plus the scratch block.
    assert!(options.num_blocks > options.max_batch * options.max_context / options.block_size);
}

#[test]
fn a_pool_too_small_for_one_top_context_sequence_is_refused() {
    let err = options(1, 64, 16, 4, vec![16]).ladder().unwrap_err();
    assert_eq!(
        err,
        LadderError::NotEnoughBlocks {
            num_blocks: 4,
            required: 5,
            max_context: 64,
            block_size: 16
        }
    );
}

#[test]
fn explicit_buckets_are_kept_and_checked_against_the_maxima() {
    let options = LadderOptions {
        batch_buckets: vec![1, 8, 64],
        context_buckets: vec![512, 2048],
        ..options(64, 2048, 16, 1 + 64 * 128, vec![512])
    };
    let ladder = options.ladder().expect("ladder");
    assert_eq!(ladder.batch_buckets, vec![1, 8, 64]);
    assert_eq!(ladder.context_buckets, vec![512, 2048]);
    assert_eq!(
        ladder.decode_entry(9, 600).map(|p| (p.batch, p.context)),
        Ok((64, 2048))
    );

    let err = LadderOptions {
        batch_buckets: vec![1, 8],
        ..options.clone()
    }
    .ladder()
    .unwrap_err();
    assert!(err.to_string().contains("64"), "{err}");

    let err = LadderOptions {
        context_buckets: vec![500, 2048],
        ..options
    }
    .ladder()
    .unwrap_err();
    assert!(err.to_string().contains("500"), "{err}");
}

/// The fixture ladder with prefill entries of 1 and 2 prompts.
fn two_prompt_ladder() -> Ladder {
    Ladder {
        prefill_batch_buckets: vec![1, 2],
        ..fixture::ladder()
    }
}

#[test]
fn prefill_batch_selection_rounds_up_to_the_smallest_covering_point() {
    let ladder = two_prompt_ladder();
    for batch in 1..=ladder.max_prefill_batch() {
        for tokens in 1..=ladder.max_prefill_chunk() {
            for context in tokens..=ladder.max_context {
                let expected = brute_force(&ladder, EntryKind::Prefill, batch, tokens, context)
                    .expect("a covering point exists below the top");
                assert_eq!(
                    ladder.prefill_batch_entry(batch, tokens, context),
                    Ok(expected)
                );
            }
        }
    }
    assert_eq!(ladder.max_prefill_batch(), 2);
    assert_eq!(
        ladder.prefill_batch_entry(3, 4, 8),
        Err(LadderError::PrefillBatchTooLarge {
            requested: 3,
            max: 2
        })
    );
    let refusal = ladder.prefill_batch_entry(3, 4, 8).unwrap_err().to_string();
    assert!(refusal.contains("3") && refusal.contains("2"), "{refusal}");
}

#[test]
fn prefill_points_are_every_prefill_batch_chunk_and_context_the_chunk_fits() {
    let ladder = two_prompt_ladder();
    let prefill: Vec<(usize, usize, usize)> = ladder
        .points()
        .into_iter()
        .filter(|p| p.kind == EntryKind::Prefill)
        .map(|p| (p.batch, p.tokens, p.context))
        .collect();
    let mut expected = Vec::new();
    for &context in &ladder.context_buckets {
        for &batch in &ladder.prefill_batch_buckets {
            for &tokens in &ladder.prefill_chunks {
                if tokens <= context {
                    expected.push((batch, tokens, context));
                }
            }
        }
    }
    assert_eq!(prefill, expected);
    // The fixture: chunks 8 and 16, contexts 16 and 32, two prefill batches.
    assert_eq!(prefill.len(), 2 * (2 + 2));
}

#[test]
fn prefill_batch_buckets_from_options_are_sorted_and_default_to_one_prompt() {
    let derived = options(8, 256, 16, 1 + 8 * 16, vec![64]).ladder().unwrap();
    assert_eq!(derived.prefill_batch_buckets, vec![1]);
    assert_eq!(derived.max_prefill_batch(), 1);

    let chosen = LadderOptions {
        prefill_batch_buckets: vec![4, 1, 4, 2],
        ..options(8, 256, 16, 1 + 8 * 16, vec![64])
    }
    .ladder()
    .unwrap();
    assert_eq!(chosen.prefill_batch_buckets, vec![1, 2, 4]);
    assert_eq!(chosen.max_prefill_batch(), 4);
    assert_eq!(chosen.prefill_batch_for(3), 4);

    let err = LadderOptions {
        prefill_batch_buckets: vec![1, 16],
        ..options(8, 256, 16, 1 + 8 * 16, vec![64])
    }
    .ladder()
    .unwrap_err();
    assert!(
        matches!(
            err,
            LadderError::Malformed {
                field: "prefillBatchBuckets",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("16") && err.to_string().contains("maxBatch 8"));
}

#[test]
fn an_artifact_that_states_no_prefill_batch_buckets_loads_as_one_prompt_per_step() {
    let (_tmp, dir, _) = fixture::written();
    // A ladder of prefill batch [1] is written without the field, as artifacts were before it.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let ladder = manifest["ladder"].as_object().expect("a ladder object");
    assert!(!ladder.contains_key("prefillBatchBuckets"), "{ladder:?}");

    let artifact = Artifact::open(&dir).expect("an artifact without the field opens");
    let ladder = &artifact.manifest().ladder;
    assert_eq!(ladder.prefill_batch_buckets, vec![1]);
    assert_eq!(ladder.max_prefill_batch(), 1);
    assert!(
        artifact
            .manifest()
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Prefill)
            .all(|e| e.batch == 1)
    );
}

#[test]
fn an_artifact_with_prefill_batch_buckets_has_an_entry_for_each_point() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("artifact");
    fixture::write_with(&dir, two_prompt_ladder());
    let artifact = Artifact::open(&dir).expect("open");
    let manifest = artifact.manifest();
    assert_eq!(manifest.ladder.prefill_batch_buckets, vec![1, 2]);
    let point = manifest.ladder.prefill_batch_entry(2, 5, 12).unwrap();
    let entry = manifest
        .entry_for(&point)
        .expect("an entry for two prompts");
    assert_eq!((entry.batch, entry.tokens, entry.context), (2, 8, 16));
    let program = artifact.program(&entry.name).expect("program");
    assert_eq!(program.inputs[0].dims, vec![2, 8]);

    // An entry missing for one of the points is refused naming it.
    fixture::edit_manifest(&dir, |m| {
        let entries = m["entries"].as_array_mut().unwrap();
        entries.retain(|e| e["name"] != "prefill_b2_t8_c16");
    });
    let Err(err) = Artifact::open(&dir) else {
        panic!("an artifact missing an entry was accepted");
    };
    assert!(err.to_string().contains("prefill_b2_t8_c16"), "{err}");
}
