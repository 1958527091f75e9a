//! Harness: arbitrary bytes as the JSON body of `/v1/completions` and `/v1/chat/completions`
//! (the parser, not the model). Parsing never panics, whatever the nesting or the numbers.
//! Shared by the cargo-fuzz target and the stable test that runs the seeds and their mutations.

pub fn run(data: &[u8]) {
    let _ = serde_json::from_slice::<tlaloc_server::request::CompletionRequest>(data);
    let _ = serde_json::from_slice::<tlaloc_server::request::ChatRequest>(data);
}
