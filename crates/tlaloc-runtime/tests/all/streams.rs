//! Submitting requests to an engine and reading their token streams, for the engine tests over
//! the fake model and over real plugins.

use tlaloc_runtime::{EngineHandle, FinishReason, GenerateRequest, TokenEvent};
use tokio::sync::mpsc::UnboundedReceiver;

/// Submits every request (none refused) and returns their event streams in order.
pub fn submit_all(
    engine: &EngineHandle,
    requests: impl IntoIterator<Item = GenerateRequest>,
) -> Vec<UnboundedReceiver<TokenEvent>> {
    requests
        .into_iter()
        .map(|request| engine.submit(request).expect("request accepted").1)
        .collect()
}

/// Submits a greedy request for each prompt, prompt `i` with a budget of `budget(i)` tokens.
pub fn submit_greedy(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    budget: impl Fn(usize) -> usize,
) -> Vec<UnboundedReceiver<TokenEvent>> {
    submit_all(
        engine,
        prompts
            .into_iter()
            .enumerate()
            .map(|(i, p)| GenerateRequest::greedy(p, budget(i))),
    )
}

/// The generated ids and why the request ended, or the error message it ended with.
pub fn try_collect_ids(
    mut events: UnboundedReceiver<TokenEvent>,
) -> Result<(Vec<u32>, FinishReason), String> {
    let mut ids = Vec::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            TokenEvent::Token { id, .. } => ids.push(id),
            TokenEvent::Finished { reason, .. } => return Ok((ids, reason)),
            TokenEvent::Error { message } => return Err(format!("request failed: {message}")),
        }
    }
    Err("stream ended without Finished".into())
}

/// [`try_collect_ids`], panicking on a failed request.
pub fn collect_ids(events: UnboundedReceiver<TokenEvent>) -> (Vec<u32>, FinishReason) {
    try_collect_ids(events).unwrap_or_else(|message| panic!("{message}"))
}
