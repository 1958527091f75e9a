//! Ladder selection against a brute-force search over the ladder's points, refusals over the
//! top, and the derivation rule for ladders built from export options.

use tlaloc_artifact::{EntryKind, Ladder, LadderError, LadderOptions, LadderPoint};

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
    let cases: [(&str, Corrupt); 5] = [
        ("batchBuckets", |l| l.batch_buckets = vec![2, 1]),
        ("batchBuckets", |l| l.batch_buckets = vec![1, 1, 2]),
        ("contextBuckets", |l| l.context_buckets = vec![]),
        ("contextBuckets", |l| l.context_buckets = vec![16]),
        ("prefillChunks", |l| l.prefill_chunks = vec![8, 64]),
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
    assert!(points.len() <= 16, "{} entries", points.len());
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
