//! Routes against the scripted engine: what is generated must be the tokenizer's decoding of
//! the ids the script produces; every refusal must carry its status and name its field.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tlaloc_server::{AppState, ServerConfig, router};
use tower::ServiceExt;

use crate::fake::{BLOCK_SIZE, Harness, harness, harness_failing, model_text, reference_ids};

fn config() -> ServerConfig {
    ServerConfig::new("tiny")
}

fn quick() -> Harness {
    harness(config(), &[1, 2, 4], Duration::ZERO)
}

fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .expect("request")
}

async fn send(h: &Harness, req: Request<Body>) -> Response<Body> {
    router(h.state.clone())
        .oneshot(req)
        .await
        .expect("infallible")
}

async fn json_of(response: Response<Body>) -> Value {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

async fn call(h: &Harness, path: &str, body: Value) -> (StatusCode, Value) {
    let response = send(h, post(path, body.to_string())).await;
    let status = response.status();
    (status, json_of(response).await)
}

fn decode(h: &Harness, ids: &[u32]) -> String {
    h.state.text.codec.decode(ids, true).expect("decode")
}

fn prompt_len(h: &Harness, text: &str) -> usize {
    h.state.text.codec.encode(text, true).expect("encode").len()
}

/// Every 400 names its field, with an OpenAI-style body.
#[tokio::test]
async fn every_invalid_field_is_refused_with_400_naming_it() {
    let h = quick();
    let ok = json!({"model": "tiny", "prompt": "Hello", "max_tokens": 4});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/v1/completions", with("model", json!("other")), "model"),
        (
            "/v1/completions",
            with("max_tokens", json!(0)),
            "max_tokens",
        ),
        (
            "/v1/completions",
            with("max_tokens", json!(1000)),
            "max_tokens",
        ),
        (
            "/v1/completions",
            with("temperature", json!(-1)),
            "temperature",
        ),
        (
            "/v1/completions",
            with("temperature", json!("hot")),
            "temperature",
        ),
        ("/v1/completions", with("top_p", json!(0)), "top_p"),
        ("/v1/completions", with("top_k", json!(-5)), "top_k"),
        ("/v1/completions", with("min_p", json!(1.5)), "min_p"),
        (
            "/v1/completions",
            with("presence_penalty", json!(3)),
            "presence_penalty",
        ),
        (
            "/v1/completions",
            with("frequency_penalty", json!(-3)),
            "frequency_penalty",
        ),
        (
            "/v1/completions",
            with("repetition_penalty", json!(0)),
            "repetition_penalty",
        ),
        ("/v1/completions", with("n", json!(0)), "n"),
        ("/v1/completions", with("n", json!(100)), "n"),
        ("/v1/completions", with("logprobs", json!(21)), "logprobs"),
        ("/v1/completions", with("seed", json!(-1)), "seed"),
        ("/v1/completions", with("stop", json!([""])), "stop"),
        (
            "/v1/completions",
            with("stream_options", json!({"include_usage": true})),
            "stream_options",
        ),
        ("/v1/completions", with("echo", json!(true)), "echo"),
        (
            "/v1/completions",
            with("logit_bias", json!({"5": 500})),
            "logit_bias",
        ),
        (
            "/v1/completions",
            with("logit_bias", json!({"five": 1})),
            "logit_bias",
        ),
        (
            "/v1/completions",
            with("structured_outputs", json!({"regex": "a", "choice": ["b"]})),
            "structured_outputs",
        ),
        (
            "/v1/completions",
            with("frobnicate", json!(1)),
            "frobnicate",
        ),
        ("/v1/completions", with("prompt", json!([])), "prompt"),
        ("/v1/completions", with("prompt", json!([999999])), "prompt"),
        (
            "/v1/completions",
            with("prompt", json!(["a", "b"])),
            "prompt",
        ),
        ("/v1/completions", json!({"model": "tiny"}), "prompt"),
        ("/v1/chat/completions", json!({"model": "tiny"}), "messages"),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -2}),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": []}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "retrieval"}], "tool_choice": "none"}),
            "tools[0].type",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice.function.name",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
                "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "[1]"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
        ),
        ("/detokenize", json!({"tokens": [1, 4000000]}), "tokens[1]"),
    ];
    for (path, body, param) in cases {
        let (status, body_json) = call(&h, path, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {body_json}"
        );
        let error = &body_json["error"];
        assert_eq!(error["param"], json!(param), "{path} {body}: {body_json}");
        assert_eq!(error["type"], json!("invalid_request_error"));
        let message = error["message"].as_str().expect("message");
        assert!(!message.is_empty());
    }
    // Nothing refused reached the engine.
    assert_eq!(h.engine.stats().prompt_tokens_total, 0);
}

#[tokio::test]
async fn malformed_json_is_a_400_about_the_body() {
    let h = quick();
    for bad in ["{\"prompt\": ", "not json", "[1, 2]"] {
        let response = send(&h, post("/v1/completions", bad)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body = json_of(response).await;
        assert!(
            body["error"]["message"].as_str().unwrap().contains("JSON")
                || body["error"]["param"] == json!(".")
                || body["error"]["param"] == json!("body"),
            "{bad}: {body}"
        );
    }
}

#[tokio::test]
async fn the_context_limit_is_refused_by_name_not_clamped() {
    let h = quick();
    let (status, body) = call(
        &h,
        "/v1/completions",
        json!({"prompt": vec![5; 100], "max_tokens": 40}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], json!("max_tokens"));
    assert_eq!(body["error"]["code"], json!("context_length_exceeded"));
    assert!(body["error"]["message"].as_str().unwrap().contains("128"));
}

/// A refusal only the engine can make names the field the request spelled its budget or its
/// prompt with.
#[tokio::test]
async fn engine_refusals_name_the_field_the_request_used() {
    let h = quick();
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        (
            json!({"messages": messages, "max_completion_tokens": 400}),
            "max_completion_tokens",
        ),
        (
            json!({"messages": messages, "max_tokens": 400}),
            "max_tokens",
        ),
    ];
    for (body, param) in cases {
        let (status, body) = call(&h, "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["param"], json!(param), "{body}");
        assert_eq!(body["error"]["code"], json!("context_length_exceeded"));
    }
    let (status, body) = call(&h, "/v1/completions", json!({"prompt": [1, 99999999]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], json!("prompt"));
    assert_eq!(body["error"]["code"], json!(null));
    assert_eq!(h.engine.stats().prompt_tokens_total, 0);
}

#[tokio::test]
async fn api_key_is_required_on_the_api_and_not_on_health() {
    let mut c = config();
    c.api_key = Some("s3cret".into());
    let h = harness(c, &[1], Duration::ZERO);
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    for auth in [
        None,
        Some("Bearer nope"),
        Some("s3cret"),
        Some("Bearer s3cre"),
    ] {
        let mut req = post("/v1/completions", body.clone());
        if let Some(a) = auth {
            req.headers_mut()
                .insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        let response = send(&h, req).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let b = json_of(response).await;
        assert_eq!(b["error"]["type"], json!("authentication_error"));
    }
    let mut req = post("/v1/completions", body);
    req.headers_mut()
        .insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
    assert_eq!(send(&h, req).await.status(), StatusCode::OK);
    let health = Request::get("/health").body(Body::empty()).unwrap();
    assert_eq!(send(&h, health).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let mut c = config();
    c.max_body_bytes = 1000;
    let h = harness(c, &[1], Duration::ZERO);
    let big = json!({"prompt": "x".repeat(2000), "max_tokens": 1}).to_string();
    let response = send(&h, post("/v1/completions", big)).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = json_of(response).await;
    assert!(body["error"]["message"].as_str().unwrap().contains("1000"));
    let small = json!({"prompt": "x", "max_tokens": 1}).to_string();
    assert_eq!(
        send(&h, post("/v1/completions", small)).await.status(),
        StatusCode::OK
    );
}

/// With one decode row and no queue, a second request while a stream is open gets 429 with
/// `Retry-After`; closing the stream frees its place.
#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let mut c = config();
    c.max_queue = 0;
    let h = harness(c, &[1], Duration::from_millis(5));
    let streaming = json!({"prompt": "Hi", "max_tokens": 100, "stream": true}).to_string();
    let open = send(&h, post("/v1/completions", streaming.clone())).await;
    assert_eq!(open.status(), StatusCode::OK);
    let refused = send(&h, post("/v1/completions", streaming.clone())).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    assert_eq!(
        json_of(refused).await["error"]["type"],
        json!("rate_limit_error")
    );
    drop(open);
    let again = send(&h, post("/v1/completions", streaming)).await;
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn not_ready_until_the_engine_is_set() {
    let state = AppState::new(config(), model_text());
    let app = router(state.clone());
    let ready = || Request::get("/ready").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(ready()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let response = app
        .clone()
        .oneshot(post("/v1/completions", json!({"prompt": "x"}).to_string()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let h = quick();
    state.set_engine(h.engine.clone());
    assert_eq!(app.oneshot(ready()).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn completion_text_and_usage_match_the_script() {
    let h = quick();
    let prompt = "Once upon a time";
    let (status, body) = call(
        &h,
        "/v1/completions",
        json!({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let p = prompt_len(&h, prompt);
    let expected = decode(&h, &reference_ids(&h.sentence, p, 12));
    assert_eq!(body["choices"][0]["text"], json!(expected));
    assert_eq!(body["choices"][0]["finish_reason"], json!("length"));
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": p, "completion_tokens": 12, "total_tokens": p + 12})
    );
    assert_eq!(body["object"], json!("text_completion"));
}

#[tokio::test]
async fn stop_strings_end_the_text_before_them() {
    let h = quick();
    let prompt = [7u32, 8, 9];
    let full = decode(&h, &reference_ids(&h.sentence, 3, 40));
    for stop in ["lazy", " café", "hello."] {
        let (status, body) = call(
            &h,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 40, "stop": [stop, "never-seen"]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let at = full.find(stop).expect("the script says it");
        assert_eq!(
            body["choices"][0]["text"],
            json!(&full[..at]),
            "stop {stop:?}"
        );
        assert_eq!(body["choices"][0]["finish_reason"], json!("stop"));
    }
}

/// Reads an SSE body to the end; returns the `data:` payloads.
async fn sse_events(response: Response<Body>) -> Vec<String> {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn streamed_chunks_concatenate_to_the_script_with_usage_last() {
    let h = quick();
    for endpoint in ["/v1/completions", "/v1/chat/completions"] {
        let mut body = json!({
            "max_tokens": 20, "n": 2, "stream": true,
            "stream_options": {"include_usage": true},
        });
        let p = if endpoint == "/v1/completions" {
            body["prompt"] = json!([11, 12, 13, 14]);
            4
        } else {
            let messages = json!([{"role": "user", "content": "Hi"}]);
            body["messages"] = messages.clone();
            let (_, t) = call(&h, "/tokenize", json!({"messages": messages})).await;
            t["count"].as_u64().unwrap() as usize
        };
        let response = send(&h, post(endpoint, body.to_string())).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        let events = sse_events(response).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let expected = decode(&h, &reference_ids(&h.sentence, p, 20));
        for index in 0..2 {
            let mut text = String::new();
            let mut finish = None;
            for c in &chunks {
                for choice in c["choices"].as_array().unwrap() {
                    if choice["index"] == json!(index) {
                        let piece = if endpoint == "/v1/completions" {
                            &choice["text"]
                        } else {
                            &choice["delta"]["content"]
                        };
                        text.push_str(piece.as_str().unwrap_or(""));
                        if !choice["finish_reason"].is_null() {
                            finish = Some(choice["finish_reason"].clone());
                        }
                    }
                }
            }
            assert_eq!(text, expected, "{endpoint} choice {index}");
            assert_eq!(finish, Some(json!("length")));
        }
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": p, "completion_tokens": 40, "total_tokens": p + 40})
        );
    }
}

#[tokio::test]
async fn logprobs_come_back_in_each_endpoints_shape() {
    let h = quick();
    let (status, body) = call(
        &h,
        "/v1/completions",
        json!({"prompt": [3, 4], "max_tokens": 5, "logprobs": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids = reference_ids(&h.sentence, 2, 5);
    let lp = &body["choices"][0]["logprobs"];
    let tokens: Vec<String> = ids
        .iter()
        .map(|&i| h.state.text.codec.decode(&[i], false).unwrap())
        .collect();
    assert_eq!(lp["tokens"], json!(tokens));
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    for (k, t) in tokens.iter().enumerate() {
        // All mass on the scripted token: its log-probability is ~0 and it tops the list.
        assert!(lp["token_logprobs"][k].as_f64().unwrap() > -1e-3);
        let top = lp["top_logprobs"][k].as_object().unwrap();
        assert_eq!(top.len(), 2);
        assert!(top[t].as_f64().unwrap() > -1e-3);
    }
    let (status, body) = call(
        &h,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 3);
    for c in content {
        assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(c["top_logprobs"][0]["token"], c["token"]);
    }
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let h = quick();
    let text = "Café naïve résumé";
    let (status, body) = call(&h, "/tokenize", json!({"prompt": text})).await;
    assert_eq!(status, StatusCode::OK);
    let ids = h.state.text.codec.encode(text, true).unwrap();
    assert_eq!(body["tokens"], json!(ids));
    assert_eq!(body["count"], json!(ids.len()));
    assert_eq!(body["max_model_len"], json!(crate::fake::MAX_CONTEXT));
    let (status, body) = call(&h, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["prompt"], json!(text));
}

async fn wait_for_pages_free(h: &Harness) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = h.engine.stats();
        if s.kv_pages_used == 0 && s.running == 0 && s.waiting == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "pages still held: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Dropping a stream mid-way (what a disconnect does to the response body) aborts the
/// sequences: pages come back and generation stops short of the budget.
#[tokio::test]
async fn a_dropped_stream_aborts_its_sequences_and_frees_pages() {
    let h = harness(config(), &[1, 2, 4], Duration::from_millis(5));
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 100, "n": 2, "stream": true});
    let response = send(&h, post("/v1/completions", body.to_string())).await;
    let mut stream = response.into_body();
    for _ in 0..3 {
        stream.frame().await.expect("a frame").expect("data");
    }
    assert!(h.engine.stats().kv_pages_used > 0);
    drop(stream);
    wait_for_pages_free(&h).await;
    let generated = h.engine.stats().generation_tokens_total;
    assert!(
        generated < 200,
        "generated {generated} tokens after the drop"
    );
}

/// The same for a non-streaming request whose handler future is dropped.
#[tokio::test]
async fn a_dropped_request_aborts_its_sequence() {
    let h = harness(config(), &[1], Duration::from_millis(5));
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 100});
    let request = send(&h, post("/v1/completions", body.to_string()));
    let timed_out = tokio::time::timeout(Duration::from_millis(100), request).await;
    assert!(
        timed_out.is_err(),
        "100 tokens at 5 ms cannot finish in 100 ms"
    );
    wait_for_pages_free(&h).await;
    assert!(h.engine.stats().generation_tokens_total < 100);
}

/// The server's `/metrics` page, read once: a lookup of a sample by its full name (labels
/// included), which panics naming the sample when it is missing.
async fn metrics_of(h: &Harness) -> impl Fn(&str) -> f64 {
    let response = send(h, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    move |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
    }
}

#[tokio::test]
async fn metrics_count_tokens_and_latencies_under_the_prefix() {
    let h = quick();
    let (status, _) = call(
        &h,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 6}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let value = metrics_of(&h).await;
    assert_eq!(value("tlaloc:prompt_tokens_total"), 2.0);
    assert_eq!(value("tlaloc:generation_tokens_total"), 6.0);
    // The first token comes from the prompt's prefill step, the other five from decode steps;
    // the scripted executor does not chain.
    assert_eq!(value("tlaloc:decode_steps_total"), 5.0);
    assert_eq!(value("tlaloc:decode_chained_steps_total"), 0.0);
    assert_eq!(value("tlaloc:num_requests_running"), 0.0);
    assert_eq!(value("tlaloc:kv_cache_usage_perc"), 0.0);
    assert_eq!(value("tlaloc:time_to_first_token_seconds_count"), 1.0);
    assert_eq!(value("tlaloc:inter_token_latency_seconds_count"), 5.0);
    assert_eq!(value("tlaloc:e2e_request_latency_seconds_count"), 1.0);
    assert_eq!(
        value("tlaloc:request_success_total{finished_reason=\"length\"}"),
        1.0
    );
}

#[tokio::test]
async fn metrics_count_prefix_cache_lookups_and_hit_tokens() {
    let h = quick();
    // 40 tokens: the second request finds the first two full blocks of 16 cached.
    let prompt: Vec<u32> = (1..=40).collect();
    for _ in 0..2 {
        let (status, _) = call(
            &h,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 2}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let value = metrics_of(&h).await;
    assert_eq!(value("tlaloc:prefix_cache_lookups_total"), 2.0);
    assert_eq!(value("tlaloc:prefix_cache_lookup_hits_total"), 1.0);
    assert_eq!(value("tlaloc:prefix_cache_queries_total"), 80.0);
    assert_eq!(
        value("tlaloc:prefix_cache_hits_total"),
        2.0 * BLOCK_SIZE as f64
    );
    assert_eq!(value("tlaloc:prefix_cache_evictions_total"), 0.0);
    assert!(value("tlaloc:kv_cache_pages_cached") >= 2.0);
    assert_eq!(value("tlaloc:kv_cache_pages_used"), 0.0);
}

/// A failure inside the engine is a 500 with the error body before a response has started, and
/// the same body as an SSE event once a stream has.
#[tokio::test]
async fn an_engine_failure_is_one_error_rendered_as_status_or_as_event() {
    let h = harness_failing(config(), &[1], Duration::ZERO, Some(3));
    let body = json!({"prompt": [1, 2], "max_tokens": 10, "stream": true});
    let events = sse_events(send(&h, post("/v1/completions", body.to_string())).await).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], json!("server_error"));
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("scripted device failure"), "{message}");
    let text: String = events[..events.len() - 2]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, decode(&h, &reference_ids(&h.sentence, 2, 3)));

    let (status, body) = call(
        &h,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 10}),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["type"], json!("server_error"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("scripted device failure")
    );
}

fn post_as(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post(path);
    if let Some(t) = content_type {
        request = request.header(header::CONTENT_TYPE, t);
    }
    request.body(body.into()).expect("request")
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `created` is when each response was made, not when the server started: a response made in
/// a later second than the start says that later second, and every chunk of a stream says the
/// same.
#[tokio::test]
async fn created_is_the_time_of_each_response() {
    let h = quick();
    let started = h.state.started_at;
    while now_s() <= started {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let messages = json!([{"role": "user", "content": "Hi"}]);
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 2}),
        ),
    ] {
        let before = now_s();
        let (status, response) = call(&h, path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{response}");
        let created = response["created"].as_u64().expect("created");
        assert!(
            (before..=now_s()).contains(&created),
            "{path}: created {created}, started {started}, asked at {before}"
        );

        let mut streaming = body;
        streaming["stream"] = json!(true);
        let before = now_s();
        let events = sse_events(send(&h, post(path, streaming.to_string())).await).await;
        let after = now_s();
        let stamps: Vec<u64> = events[..events.len() - 1]
            .iter()
            .map(|e| {
                serde_json::from_str::<Value>(e).unwrap()["created"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert!(stamps.len() >= 2, "{events:?}");
        assert!(stamps.iter().all(|&s| s == stamps[0]), "{path}: {stamps:?}");
        assert!((before..=after).contains(&stamps[0]), "{path}: {stamps:?}");
    }
}

/// Only `application/json` bodies are read (parameters and case aside): anything else, or no
/// type at all, is 415 naming what is expected. `text/plain` matters most: a browser sends it
/// cross-site without asking first.
#[tokio::test]
async fn a_body_not_sent_as_application_json_is_415() {
    let h = quick();
    let body = json!({"prompt": [1, 2], "max_tokens": 1}).to_string();
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        for path in ["/v1/completions", "/tokenize"] {
            let response = send(&h, post_as(path, content_type, body.clone())).await;
            assert_eq!(
                response.status(),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{path} {content_type:?}"
            );
            let error = &json_of(response).await["error"];
            assert_eq!(error["type"], json!("invalid_request_error"));
            let message = error["message"].as_str().unwrap();
            assert!(message.contains("application/json"), "{message}");
        }
    }
    assert_eq!(h.engine.stats().prompt_tokens_total, 0);
    for content_type in ["application/json; charset=utf-8", "Application/JSON"] {
        let response = send(
            &h,
            post_as("/v1/completions", Some(content_type), body.clone()),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK, "{content_type}");
    }
}

/// A body is one JSON object and nothing after it (whitespace aside).
#[tokio::test]
async fn trailing_bytes_after_the_json_body_are_400() {
    let h = quick();
    for body in [
        r#"{"prompt": [1], "max_tokens": 1} {"prompt": [2]}"#,
        r#"{"prompt": [1], "max_tokens": 1}x"#,
        r#"{"prompt": [1], "max_tokens": 1}}"#,
        "{\"prompt\": [1], \"max_tokens\": 1}\n\0",
    ] {
        let response = send(&h, post("/v1/completions", body)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body:?}");
        let error = &json_of(response).await["error"];
        assert_eq!(error["param"], json!("body"), "{body:?}");
        assert!(
            error["message"].as_str().unwrap().contains("trailing"),
            "{error}"
        );
    }
    assert_eq!(h.engine.stats().prompt_tokens_total, 0);
    let response = send(
        &h,
        post(
            "/v1/completions",
            "{\"prompt\": [1], \"max_tokens\": 1} \r\n\t",
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// `model` may be left out (one model is served) but not sent as `null`.
#[tokio::test]
async fn model_null_is_400_naming_model() {
    let h = quick();
    let messages = json!([{"role": "user", "content": "Hi"}]);
    for (path, body) in [
        ("/v1/completions", json!({"model": null, "prompt": [1]})),
        (
            "/v1/chat/completions",
            json!({"model": null, "messages": messages}),
        ),
        ("/tokenize", json!({"model": null, "prompt": "Hi"})),
        ("/detokenize", json!({"model": null, "tokens": [1]})),
    ] {
        let (status, response) = call(&h, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {response}");
        assert_eq!(response["error"]["param"], json!("model"), "{path}");
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains("null"), "{message}");
    }
    let (status, _) = call(&h, "/tokenize", json!({"prompt": "Hi"})).await;
    assert_eq!(status, StatusCode::OK);
}

/// A system or user message needs its `content` (absent or `null`); an assistant's may be
/// empty.
#[tokio::test]
async fn a_user_or_system_message_without_content_is_400_naming_it() {
    let h = quick();
    let user = json!({"role": "user", "content": "Hi"});
    for (messages, param) in [
        (json!([{"role": "user"}]), "messages[0].content"),
        (
            json!([{"role": "user", "content": null}]),
            "messages[0].content",
        ),
        (json!([{"role": "system"}, user]), "messages[0].content"),
        (
            json!([{"role": "developer", "content": null}, user]),
            "messages[0].content",
        ),
        (
            json!([user, {"role": "assistant", "content": "Hello"}, {"role": "user"}]),
            "messages[2].content",
        ),
    ] {
        for path in ["/v1/chat/completions", "/tokenize"] {
            let (status, response) = call(&h, path, json!({"messages": messages})).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{path} {messages}: {response}"
            );
            assert_eq!(
                response["error"]["param"],
                json!(param),
                "{path} {messages}"
            );
        }
    }
    assert_eq!(h.engine.stats().prompt_tokens_total, 0);
    let (status, response) = call(
        &h,
        "/tokenize",
        json!({"messages": [user, {"role": "assistant"}, user]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{response}");
}

/// The authorization scheme is case-insensitive (RFC 9110, section 11.1); the key is not.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let mut c = config();
    c.api_key = Some("s3cret".into());
    let h = harness(c, &[1], Duration::ZERO);
    let body = json!({"prompt": [1], "max_tokens": 1}).to_string();
    let with_auth = |auth: &str| {
        let mut req = post("/v1/completions", body.clone());
        req.headers_mut()
            .insert(header::AUTHORIZATION, auth.parse().unwrap());
        req
    };
    for accepted in [
        "bearer s3cret",
        "BEARER s3cret",
        "bEaReR s3cret",
        "Bearer  s3cret",
    ] {
        assert_eq!(
            send(&h, with_auth(accepted)).await.status(),
            StatusCode::OK,
            "{accepted}"
        );
    }
    for refused in [
        "bearer S3CRET",
        "Basic s3cret",
        "Bearers3cret",
        "bearer",
        "s3cret",
    ] {
        assert_eq!(
            send(&h, with_auth(refused)).await.status(),
            StatusCode::UNAUTHORIZED,
            "{refused}"
        );
    }
}

/// A `Content-Length` over the limit is answered 413, with `Connection: close`, without
/// reading the body (here, one that never arrives).
#[tokio::test]
async fn a_declared_content_length_over_the_limit_is_413_before_the_body_is_read() {
    let mut c = config();
    c.max_body_bytes = 1000;
    let idle = c.body_idle_timeout;
    let h = harness(c, &[1], Duration::ZERO);
    let never = futures_util::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    let request = Request::post("/v1/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, "99999999999999")
        .body(Body::from_stream(never))
        .unwrap();
    let response = tokio::time::timeout(idle / 4, send(&h, request))
        .await
        .expect("answered before any body byte, well before the idle timeout");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()[header::CONNECTION], "close");
    let message = json_of(response).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("1000"), "{message}");
}

/// A body that stops arriving is answered 408 once the body idle timeout has passed, with
/// `Connection: close`.
#[tokio::test]
async fn a_stalled_body_is_408_after_the_body_idle_timeout() {
    let mut c = config();
    c.body_idle_timeout = Duration::from_millis(500);
    let idle = c.body_idle_timeout;
    let h = harness(c, &[1], Duration::ZERO);
    let stalls = futures_util::stream::iter([Ok::<_, std::io::Error>(b"{\"prompt\": ".to_vec())])
        .chain(futures_util::stream::pending());
    let request = post("/v1/completions", Body::from_stream(stalls));
    let asked = Instant::now();
    let response = tokio::time::timeout(idle * 4, send(&h, request))
        .await
        .expect("answered once the idle timeout has passed");
    assert!(
        asked.elapsed() >= idle,
        "answered after {:?}",
        asked.elapsed()
    );
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(response.headers()[header::CONNECTION], "close");
    let error = &json_of(response).await["error"];
    assert_eq!(error["type"], json!("invalid_request_error"));
    assert!(
        error["message"].as_str().unwrap().contains("0.5 s"),
        "{error}"
    );
}

/// A Responses request is the chat request it amounts to: the same reply for the same
/// conversation, and the stored-state fields refused by name.
#[tokio::test]
async fn responses_give_the_chat_reply_and_refuse_stored_state_by_name() {
    let h = quick();
    let (status, chat) = call(
        &h,
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"}], "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    let (status, response) = call(
        &h,
        "/v1/responses",
        json!({"instructions": "Be brief.", "input": "Hello", "max_output_tokens": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    assert_eq!(response["object"], json!("response"));
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        chat["choices"][0]["message"]["content"]
    );
    assert_eq!(response["status"], json!("incomplete"));
    assert_eq!(
        response["incomplete_details"]["reason"],
        json!("max_output_tokens")
    );
    assert_eq!(
        response["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    assert_eq!(response["usage"]["output_tokens"], json!(5));
    for (body, param) in [
        (json!({"input": "x", "store": true}), "store"),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (json!({"max_output_tokens": 3}), "input"),
    ] {
        let (status, error) = call(&h, "/v1/responses", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["error"]["param"], json!(param), "{body}: {error}");
    }
}
