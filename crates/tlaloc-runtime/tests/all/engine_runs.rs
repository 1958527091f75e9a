//! The engine driven end to end over the fake model: batching, preemption, aborts, sampling.

use std::time::{Duration, Instant};

use tlaloc_runtime::StopParams;
use tlaloc_runtime::{
    Engine, EngineHandle, FinishReason, GenerateRequest, SamplingParams, TokenEvent,
};

use crate::fake::{FakeModel, VOCAB, grid, reference_generate};
use crate::streams::{collect_ids, submit_greedy};

fn prompts() -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            (0..(3 + 5 * i))
                .map(|k| (k * 13 + i * 7) % VOCAB as u32)
                .collect()
        })
        .collect()
}

/// An engine that runs no step until the returned sender is dropped, so that requests submitted
/// before then are all queued together.
fn start_held(num_blocks: usize) -> (EngineHandle, std::sync::mpsc::Sender<()>) {
    let (permits, gate) = std::sync::mpsc::channel();
    let model = FakeModel::new(grid(&[1, 2, 4, 8], &[4, 16], &[32, 64, 128]), 4, num_blocks)
        .with_gate(gate);
    (Engine::start(model).unwrap(), permits)
}

fn start(num_blocks: usize) -> EngineHandle {
    Engine::start(FakeModel::new(
        grid(&[1, 2, 4, 8], &[4, 16], &[32, 64, 128]),
        4,
        num_blocks,
    ))
    .unwrap()
}

fn assert_all_pages_free(engine: &EngineHandle) {
    let stats = engine.stats();
    assert_eq!(stats.kv_pages_used, 0, "pages still held: {stats:?}");
    assert_eq!((stats.running, stats.waiting), (0, 0), "{stats:?}");
}

#[test]
fn eight_prompts_together_give_the_same_ids_as_alone() {
    let max_tokens = 20;
    let engine = start(256);
    let alone: Vec<Vec<u32>> = prompts()
        .into_iter()
        .map(|p| {
            engine
                .generate_blocking(GenerateRequest::greedy(p, max_tokens))
                .unwrap()
                .token_ids
        })
        .collect();
    for (p, ids) in prompts().iter().zip(&alone) {
        assert_eq!(
            ids,
            &reference_generate(p, max_tokens, &[]),
            "alone differs from the reference"
        );
    }
    assert_all_pages_free(&engine);
    engine.shutdown();

    let (engine, hold) = start_held(256);
    let streams = submit_greedy(&engine, prompts(), |_| max_tokens);
    drop(hold);
    for (n, events) in streams.into_iter().enumerate() {
        let (ids, reason) = collect_ids(events);
        assert_eq!(ids, alone[n], "prompt {n} batched differs from alone");
        assert_eq!(reason, FinishReason::Length);
    }
    let stats = engine.stats();
    assert!(
        stats.steps.decode_rows > stats.steps.decode_steps,
        "decodes were never batched: {stats:?}"
    );
    assert_all_pages_free(&engine);
    engine.shutdown();
}

#[test]
fn a_pool_too_small_for_all_preempts_and_still_gives_the_same_ids() {
    let max_tokens = 24;
    // 20 allocatable pages of 4 tokens: the eight sequences need up to 62 tokens each.
    let (engine, hold) = start_held(21);
    let streams = submit_greedy(&engine, prompts(), |_| max_tokens);
    drop(hold);
    for (p, events) in prompts().iter().zip(streams) {
        let (ids, _) = collect_ids(events);
        assert_eq!(ids, reference_generate(p, max_tokens, &[]));
    }
    let stats = engine.stats();
    assert!(
        stats.preemptions_total > 0,
        "the pool never ran out: {stats:?}"
    );
    assert_all_pages_free(&engine);
    engine.shutdown();
}

#[test]
fn eos_and_stop_tokens_end_a_request_unless_eos_is_ignored() {
    let prompt = prompts()[3].clone();
    let free_run = reference_generate(&prompt, 30, &[]);
    let eos = free_run[5];
    let first = free_run.iter().position(|t| *t == eos).unwrap();
    let model = FakeModel::new(grid(&[1, 8], &[16], &[64]), 4, 64).with_eos(vec![eos]);
    let engine = Engine::start(model).unwrap();

    let stopped = engine
        .generate_blocking(GenerateRequest::greedy(prompt.clone(), 30))
        .unwrap();
    assert_eq!(stopped.token_ids, free_run[..=first]);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.usage.completion_tokens, first + 1);
    assert_eq!(stopped.usage.prompt_tokens, prompt.len());

    let ignoring = engine
        .generate_blocking(GenerateRequest {
            ignore_eos: true,
            ..GenerateRequest::greedy(prompt.clone(), 30)
        })
        .unwrap();
    assert_eq!(ignoring.token_ids, free_run);
    assert_eq!(ignoring.finish_reason, FinishReason::Length);

    let stop_at = free_run[2];
    let first_stop = free_run.iter().position(|t| *t == stop_at).unwrap();
    let by_stop_id = engine
        .generate_blocking(GenerateRequest {
            ignore_eos: true,
            stop: StopParams {
                stop_token_ids: vec![stop_at],
            },
            ..GenerateRequest::greedy(prompt, 30)
        })
        .unwrap();
    assert_eq!(by_stop_id.token_ids, free_run[..=first_stop]);
    assert_eq!(by_stop_id.finish_reason, FinishReason::Stop);
    assert_all_pages_free(&engine);
}

fn wait_until(
    what: &str,
    engine: &EngineHandle,
    ok: impl Fn(&tlaloc_runtime::EngineStats) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok(&engine.stats()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An engine whose steps each wait for a permit, running one 40-token prompt (three prefill
/// steps: 16, 16 and 8 tokens, the last emitting the first token) up to its first token.
fn held_after_first_token() -> (
    EngineHandle,
    std::sync::mpsc::Sender<()>,
    tlaloc_runtime::RequestId,
    tokio::sync::mpsc::UnboundedReceiver<TokenEvent>,
) {
    let (permits, gate) = std::sync::mpsc::channel();
    let model =
        FakeModel::new(grid(&[1, 2, 4, 8], &[4, 16], &[32, 64, 128]), 4, 256).with_gate(gate);
    let engine = Engine::start(model).unwrap();
    let long = GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::greedy(vec![1; 40], 80)
    };
    let (id, mut events) = engine.submit(long).unwrap();
    for _ in 0..3 {
        permits.send(()).unwrap();
    }
    assert!(matches!(
        events.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    // The engine has no permit for a fourth step: the 40 prompt tokens fill 10 pages of 4.
    assert_eq!(engine.stats().kv_pages_used, 10);
    (engine, permits, id, events)
}

#[test]
fn an_abort_frees_the_pages_at_once() {
    let (engine, permits, id, mut events) = held_after_first_token();
    engine.abort(id);
    // Let the engine run freely: the abort lands before or just after the fourth step.
    drop(permits);
    loop {
        match events.blocking_recv().expect("stream ends with Finished") {
            TokenEvent::Token { .. } => continue,
            TokenEvent::Finished { reason, usage, .. } => {
                assert_eq!(reason, FinishReason::Abort);
                assert!(usage.completion_tokens <= 2, "{usage:?}");
                break;
            }
            TokenEvent::Error { message } => panic!("{message}"),
        }
    }
    // Visible as soon as the stream says so.
    assert_all_pages_free(&engine);
    engine.shutdown();
}

#[test]
fn dropping_the_receiver_aborts_and_frees_the_pages() {
    let (engine, permits, _, events) = held_after_first_token();
    drop(events);
    drop(permits);
    wait_until("the dropped request's pages", &engine, |s| {
        s.kv_pages_used == 0 && s.running == 0
    });
    let stats = engine.stats();
    assert!(stats.generation_tokens_total <= 2, "{stats:?}");
    assert_eq!(stats.requests_finished, 1);
    engine.shutdown();
}

#[test]
fn a_seeded_sampled_run_is_reproducible_and_the_seed_matters() {
    let engine = start(256);
    let sampled = |seed| {
        let request = GenerateRequest {
            sampling: SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..SamplingParams::greedy()
            },
            logprobs: Some(2),
            ..GenerateRequest::greedy(prompts()[2].clone(), 24)
        };
        engine.generate_blocking(request).unwrap()
    };
    let a = sampled(11);
    let b = sampled(11);
    let c = sampled(12);
    assert_eq!(a.token_ids, b.token_ids);
    assert_ne!(a.token_ids, c.token_ids);
    assert_ne!(
        a.token_ids,
        reference_generate(&prompts()[2], 24, &[]),
        "sampling at T=1 over the fake's flat logits should leave the argmax path"
    );
    for (lp, top) in a.logprobs.iter().zip(&a.top_logprobs) {
        let lp = lp.expect("logprobs asked for");
        assert!(lp <= 0.0);
        assert_eq!(top.len(), 2);
        assert!(top[0].1 >= top[1].1);
    }
    // Greedy with logprobs reads logits but keeps the in-graph token.
    let greedy = engine
        .generate_blocking(GenerateRequest {
            logprobs: Some(1),
            ..GenerateRequest::greedy(prompts()[2].clone(), 24)
        })
        .unwrap();
    assert_eq!(greedy.token_ids, reference_generate(&prompts()[2], 24, &[]));
    for (token, top) in greedy.token_ids.iter().zip(&greedy.top_logprobs) {
        assert_eq!(top[0].0, *token);
    }
    assert_all_pages_free(&engine);
}

#[test]
fn shutdown_finishes_in_flight_requests_then_refuses_new_ones() {
    let engine = start(256);
    let streams: Vec<_> = prompts()
        .into_iter()
        .map(|p| {
            (
                p.clone(),
                engine.submit(GenerateRequest::greedy(p, 16)).unwrap().1,
            )
        })
        .collect();
    let other = engine.clone();
    other.shutdown();
    for (p, events) in streams {
        let (ids, reason) = collect_ids(events);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(ids, reference_generate(&p, 16, &[]));
    }
    assert!(matches!(
        engine.submit(GenerateRequest::greedy(vec![1], 1)),
        Err(tlaloc_runtime::EngineError::Stopped)
    ));
    let stats = engine.stats();
    assert_eq!(stats.requests_finished, 8);
    assert_eq!(stats.generation_tokens_total, 8 * 16);
    assert_eq!(
        stats.prompt_tokens_total,
        prompts().iter().map(|p| p.len() as u64).sum::<u64>()
    );
    assert_all_pages_free(&engine);
}

#[test]
fn a_refused_request_is_answered_at_once_by_name() {
    let engine = start(256);
    let err = engine
        .submit(GenerateRequest::greedy(vec![1; 100], 100))
        .unwrap_err();
    assert!(
        err.to_string().contains("top context bucket of 128"),
        "{err}"
    );
    let err = engine
        .submit(GenerateRequest {
            sampling: SamplingParams {
                top_p: 2.0,
                ..SamplingParams::greedy()
            },
            ..GenerateRequest::greedy(vec![1], 1)
        })
        .unwrap_err();
    assert!(err.to_string().contains("top_p"), "{err}");
}

#[test]
fn prompts_at_chunk_boundaries_and_of_one_token_match_the_reference() {
    let engine = start(256);
    // Chunks are 4 and 16: a 1-token prompt decodes at once; 4, 16, 17, 32 and 33 end exactly
    // on a chunk, one past it, or leave a single token for a decode step.
    let lengths = [1usize, 2, 4, 5, 16, 17, 32, 33];
    let streams: Vec<_> = lengths
        .iter()
        .map(|&n| {
            let prompt: Vec<u32> = (0..n as u32)
                .map(|k| (k * 29 + n as u32) % VOCAB as u32)
                .collect();
            let (_, events) = engine
                .submit(GenerateRequest::greedy(prompt.clone(), 9))
                .unwrap();
            (prompt, events)
        })
        .collect();
    for (prompt, events) in streams {
        let (ids, _) = collect_ids(events);
        assert_eq!(
            ids,
            reference_generate(&prompt, 9, &[]),
            "prompt of {} tokens",
            prompt.len()
        );
    }
    assert_all_pages_free(&engine);
}

#[test]
fn chained_decode_gives_the_same_ids_and_stops_inside_a_chain() {
    let eos = 17;
    let model = FakeModel::new(grid(&[1, 2, 4, 8], &[4, 16], &[32, 64, 128]), 4, 256)
        .with_eos(vec![eos])
        .with_chain(8);
    let engine = Engine::start(model).unwrap();
    // Budgets of 1 to 29 tokens, so rows end at every offset inside a chain; eos ends some.
    let budget = |i: usize| 1 + 4 * i;
    let streams = submit_greedy(&engine, prompts(), budget);
    for ((i, p), rx) in prompts().into_iter().enumerate().zip(streams) {
        let (ids, _) = collect_ids(rx);
        assert_eq!(ids, reference_generate(&p, budget(i), &[eos]), "{p:?}");
    }
    let stats = engine.stats();
    assert!(
        stats.steps.decode_chained_steps > 0,
        "nothing chained: {stats:?}"
    );
    assert_all_pages_free(&engine);
    engine.shutdown();
}
