//! Automatic prefix caching over the fake model: which pages are shared, how many hold each,
//! what is evicted and what is prefilled. The fake model reads every row's context back from
//! its own pools, so a shared page that was overwritten (evicted while in use, or written by a
//! sequence that only shares it) changes the tokens against the reference, which sees only the
//! plain token lists.

use std::collections::HashMap;

use tlaloc_runtime::block_manager::PageId;
use tlaloc_runtime::scheduler::{ScheduledStep, Scheduler};
use tlaloc_runtime::{Engine, EngineOptions, EntryKind, GenerateRequest, ModelExecutor};

use crate::fake::{FakeModel, VOCAB, grid, reference_generate};
use crate::parked::{in_sequence, of, run_to_end};

const BLOCK: usize = 4;

fn tokens(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|k| (k * 29 + salt * 11 + 5) % VOCAB as u32)
        .collect()
}

fn cached_scheduler(model: &FakeModel) -> Scheduler {
    let mut s = Scheduler::new(model.shape()).unwrap();
    s.set_prefix_cache(Some(b"the fake model"));
    s
}

/// Runs one step; returns its (id, token) updates.
fn step(
    s: &mut Scheduler,
    model: &mut FakeModel,
    steps: &mut Vec<ScheduledStep>,
) -> Vec<(u64, u32)> {
    let step = s.schedule().unwrap().expect("a step");
    let out = model.step(&step.entry, &step.inputs).unwrap();
    let updates = s
        .complete(&step, &out)
        .unwrap()
        .into_iter()
        .map(|u| (u.id, u.sampled.token))
        .collect();
    steps.push(step);
    updates
}

/// Prompt tokens request `id` had prefilled by prefill steps.
fn prefilled_for(steps: &[ScheduledStep], id: u64) -> usize {
    steps
        .iter()
        .filter(|s| s.entry.kind == EntryKind::Prefill)
        .flat_map(|s| &s.rows)
        .filter(|r| r.id == id)
        .map(|r| r.tokens)
        .sum()
}

/// Every page named by the live requests' tables has exactly as many holders as tables naming
/// it, and the pool counts as used exactly those pages (no parked sequences here).
fn assert_holders_match(s: &Scheduler, live: &[u64]) {
    let mut named: HashMap<PageId, u32> = HashMap::new();
    for &id in live {
        if let Some(pages) = s.pages_of(id) {
            for &page in pages {
                *named.entry(page).or_default() += 1;
            }
        }
    }
    for (&page, &count) in &named {
        assert_eq!(
            s.pool().holders(page),
            count,
            "page {page}: holders vs tables naming it"
        );
    }
    assert_eq!(
        s.pool().used(),
        named.len(),
        "pages held by nobody counted used"
    );
}

#[test]
fn a_prompt_shares_the_cached_prefix_of_a_sequence_still_running() {
    let mut model = FakeModel::new(grid(&[1, 2, 4], &[4, 8], &[32, 64]), BLOCK, 64);
    let mut s = cached_scheduler(&model);
    let shared = tokens(10, 1);
    let a: Vec<u32> = [shared.as_slice(), &[50, 51]].concat();
    let b: Vec<u32> = [shared.as_slice(), &[60, 61, 62]].concat();
    let (mut out, mut steps) = (Vec::new(), Vec::new());
    s.add(1, GenerateRequest::greedy(a.clone(), 8)).unwrap();
    while !out.iter().any(|(id, _)| *id == 1) {
        out.extend(step(&mut s, &mut model, &mut steps));
    }
    // A is decoding; B arrives with the same first two blocks.
    s.add(2, GenerateRequest::greedy(b.clone(), 8)).unwrap();
    while !out.iter().any(|(id, _)| *id == 2) {
        out.extend(step(&mut s, &mut model, &mut steps));
        assert_holders_match(&s, &[1, 2]);
    }
    let (pa, pb) = (s.pages_of(1).unwrap(), s.pages_of(2).unwrap());
    assert_eq!(pa[..2], pb[..2], "the two full blocks of the shared prefix");
    assert_ne!(pa[2], pb[2], "the third blocks differ");
    for &page in &pa[..2] {
        assert_eq!(s.pool().holders(page), 2);
    }
    assert_eq!(prefilled_for(&steps, 2), b.len() - 2 * BLOCK);
    let stats = s.counts().prefix_cache;
    assert_eq!((stats.queries, stats.hits), (2, 1));
    assert_eq!(stats.hit_tokens, 2 * BLOCK as u64);
    assert_eq!(stats.query_tokens, (a.len() + b.len()) as u64);

    let (rest, _) = run_to_end(&mut s, &mut model);
    out.extend(rest);
    assert_eq!(of(&out, 1), reference_generate(&a, 8, &[]));
    assert_eq!(of(&out, 2), reference_generate(&b, 8, &[]));
    let counts = s.counts();
    assert_eq!(counts.pages_used, 0);
    assert!(counts.pages_cached > 0, "released blocks stay cached");
    assert_eq!(s.pool().evictable(), counts.pages_cached);
}

#[test]
fn a_whole_cached_prompt_still_computes_its_last_token() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[32]), BLOCK, 32);
    let mut s = cached_scheduler(&model);
    let prompt = tokens(2 * BLOCK, 2);
    s.add(1, GenerateRequest::greedy(prompt.clone(), 3))
        .unwrap();
    let (first, _) = run_to_end(&mut s, &mut model);

    // The same prompt: its second block holds the last token, so it is prefilled again.
    s.add(2, GenerateRequest::greedy(prompt.clone(), 3))
        .unwrap();
    let (again, steps) = run_to_end(&mut s, &mut model);
    assert_eq!(of(&again, 2), of(&first, 1));
    assert_eq!(prefilled_for(&steps, 2), BLOCK);

    // One token more: both blocks are cached and the last token is decoded directly.
    let longer: Vec<u32> = [prompt.as_slice(), &[7]].concat();
    s.add(3, GenerateRequest::greedy(longer.clone(), 3))
        .unwrap();
    let (out, steps) = run_to_end(&mut s, &mut model);
    assert_eq!(of(&out, 3), reference_generate(&longer, 3, &[]));
    assert_eq!(prefilled_for(&steps, 3), 0);
    assert_eq!(steps[0].entry.kind, EntryKind::Decode);
    let stats = s.counts().prefix_cache;
    assert_eq!((stats.queries, stats.hits), (3, 2));
    assert_eq!(stats.hit_tokens, 3 * BLOCK as u64);
}

#[test]
fn without_the_cache_every_prompt_is_prefilled_whole() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[32]), BLOCK, 32);
    let mut s = Scheduler::new(model.shape()).unwrap();
    let prompt = tokens(11, 3);
    for id in 1..=2 {
        s.add(id, GenerateRequest::greedy(prompt.clone(), 3))
            .unwrap();
        let (out, steps) = run_to_end(&mut s, &mut model);
        assert_eq!(of(&out, id), reference_generate(&prompt, 3, &[]));
        assert_eq!(prefilled_for(&steps, id), prompt.len());
    }
    let counts = s.counts();
    assert_eq!(counts.prefix_cache, Default::default());
    assert_eq!(counts.pages_cached, 0);
}

#[test]
fn eviction_under_page_pressure_takes_only_pages_nobody_holds() {
    // 12 allocatable pages of 4 tokens.
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[32]), BLOCK, 13);
    let mut s = cached_scheduler(&model);
    let a = tokens(3 * BLOCK, 4);
    s.add(1, GenerateRequest::greedy(a.clone(), 4)).unwrap();
    run_to_end(&mut s, &mut model);
    // A's prompt blocks and its first output block are cached, nobody holds them.
    assert_eq!(s.pool().evictable(), 3);
    assert_eq!(s.pool().used(), 0);

    // B shares A's first two blocks and keeps them while C needs the rest of the pool: B
    // grows to 4 pages and C to 8, so A's last cached block must be evicted.
    let b: Vec<u32> = [&a[..2 * BLOCK], &[70, 71, 72]].concat();
    let c = tokens(27, 5);
    let (mut out, mut steps) = (Vec::new(), Vec::new());
    s.add(2, GenerateRequest::greedy(b.clone(), 6)).unwrap();
    out.extend(step(&mut s, &mut model, &mut steps));
    let b_shared: Vec<PageId> = s.pages_of(2).unwrap()[..2].to_vec();
    s.add(3, GenerateRequest::greedy(c.clone(), 4)).unwrap();
    while s.has_work() {
        out.extend(step(&mut s, &mut model, &mut steps));
        assert_holders_match(&s, &[2, 3]);
        if let Some(pages) = s.pages_of(2).filter(|p| !p.is_empty()) {
            assert_eq!(pages[..2], b_shared[..], "B's shared pages stay its own");
        }
    }
    assert!(s.pool().evictions() > 0, "C had to evict cached pages");
    assert_eq!(s.counts().preemptions, 0, "eviction came before preemption");
    assert_eq!(of(&out, 2), reference_generate(&b, 6, &[]));
    assert_eq!(of(&out, 3), reference_generate(&c, 4, &[]));
    assert_eq!(s.pool().used(), 0);
}

#[test]
fn preempting_a_sequence_that_shares_pages_leaves_them_to_the_other_and_it_hits_on_return() {
    // 8 allocatable pages: A grows to 6, B to 2 shared + 5 of its own; someone is preempted.
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[32]), BLOCK, 9);
    let mut s = cached_scheduler(&model);
    let a = tokens(2 * BLOCK, 6);
    let b: Vec<u32> = [a.as_slice(), &[33]].concat();
    let (mut out, mut steps) = (Vec::new(), Vec::new());
    s.add(1, GenerateRequest::greedy(a.clone(), 16)).unwrap();
    out.extend(step(&mut s, &mut model, &mut steps));
    s.add(2, GenerateRequest::greedy(b.clone(), 16)).unwrap();
    out.extend(step(&mut s, &mut model, &mut steps));
    let a_pages: Vec<PageId> = s.pages_of(1).unwrap()[..2].to_vec();
    assert_eq!(
        s.pages_of(2).unwrap()[..2],
        a_pages[..],
        "B shares A's prompt"
    );
    let mut saw_preempted = false;
    while s.has_work() {
        out.extend(step(&mut s, &mut model, &mut steps));
        assert_holders_match(&s, &[1, 2]);
        let b_pages = s.pages_of(2).map(<[PageId]>::len);
        if s.counts().preemptions > 0 && b_pages == Some(0) && s.pages_of(1).is_some() {
            saw_preempted = true;
            for &page in &a_pages {
                assert_eq!(s.pool().holders(page), 1, "A still holds page {page}");
            }
        }
    }
    assert!(saw_preempted, "B was never preempted while A ran");
    assert_eq!(of(&out, 1), reference_generate(&a, 16, &[]));
    assert_eq!(of(&out, 2), reference_generate(&b, 16, &[]));
    let counts = s.counts();
    assert!(
        counts.prefix_cache.hits >= 2,
        "B hit again when it came back: {:?}",
        counts.prefix_cache
    );
    assert_eq!(counts.pages_used, 0);
}

#[test]
fn a_parked_sequence_shares_its_blocks_with_a_request_repeating_its_history() {
    let mut model = FakeModel::new(grid(&[1, 2], &[4, 8], &[64]), BLOCK, 32);
    let mut s = cached_scheduler(&model);
    let first = tokens(9, 7);
    s.add(1, in_sequence(first.clone(), 4, 5, true)).unwrap();
    let (out, _) = run_to_end(&mut s, &mut model);
    let history: Vec<u32> = [first.as_slice(), &of(&out, 1)].concat();
    let parked_used = s.counts().pages_used;
    assert_eq!(s.counts().parked, 1);

    // An unrelated request whose prompt is the parked conversation plus a new turn.
    let prompt: Vec<u32> = [history.as_slice(), &[1, 2, 3]].concat();
    s.add(2, GenerateRequest::greedy(prompt.clone(), 3))
        .unwrap();
    let mut steps = Vec::new();
    let first_out = step(&mut s, &mut model, &mut steps);
    let shared = s.pages_of(2).unwrap()[..3].to_vec();
    for &page in &shared {
        assert_eq!(
            s.pool().holders(page),
            2,
            "held by the parked sequence and request 2"
        );
    }
    let (rest, more) = run_to_end(&mut s, &mut model);
    steps.extend(more);
    let got: Vec<u32> = first_out
        .iter()
        .chain(&rest)
        .filter(|(id, _)| *id == 2)
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(got, reference_generate(&prompt, 3, &[]));
    assert_eq!(prefilled_for(&steps, 2), prompt.len() - 3 * BLOCK);
    assert_eq!(
        s.counts().pages_used,
        parked_used,
        "only the parked pages stay held"
    );

    // The conversation continues on its own pages.
    s.add(3, in_sequence(vec![9, 9], 3, 5, false)).unwrap();
    let (out, _) = run_to_end(&mut s, &mut model);
    let whole: Vec<u32> = [history.as_slice(), &[9, 9]].concat();
    assert_eq!(of(&out, 3), reference_generate(&whole, 3, &[]));
    assert_eq!(s.counts().pages_used, 0);
}

#[test]
fn the_engine_caches_by_default_counts_hits_and_can_be_told_not_to() {
    let model = || FakeModel::new(grid(&[1, 2, 4], &[4, 16], &[64]), BLOCK, 64);
    let system = tokens(20, 8);
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| [system.as_slice(), &tokens(3, 20 + i)].concat())
        .collect();
    for cache in [true, false] {
        let engine = Engine::start_with_options(
            model(),
            EngineOptions {
                prefix_cache: cache,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        for p in &prompts {
            let got = engine
                .generate_blocking(GenerateRequest::greedy(p.clone(), 5))
                .unwrap();
            assert_eq!(got.token_ids, reference_generate(p, 5, &[]));
        }
        let stats = engine.stats();
        assert_eq!(stats.kv_pages_used, 0);
        if cache {
            assert_eq!(stats.prefix_cache.queries, 3);
            assert_eq!(stats.prefix_cache.hits, 2);
            // The 20 shared tokens hold 5 full blocks.
            assert_eq!(stats.prefix_cache.hit_tokens, 2 * 20);
            assert!(stats.kv_pages_cached > 0);
        } else {
            assert_eq!(stats.prefix_cache, Default::default());
            assert_eq!(stats.kv_pages_cached, 0);
        }
        engine.shutdown();
    }
}
