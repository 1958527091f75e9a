//! The chat template and incremental detokenization against transformers' own outputs (the
//! golden file made by the project's oracle script).

use serde_json::Value;
use tlaloc_server::chat::TemplateMessage;
use tlaloc_server::text::IncrementalDecoder;

use crate::fake::{model_text, workspace};

fn golden() -> Value {
    let path = workspace().join("tests/data/goldens/SmolLM2-135M-Instruct.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `bash scripts/oracle/regenerate.sh`",
            path.display()
        )
    });
    serde_json::from_slice(&bytes).expect("golden JSON")
}

/// The fixture carries SmolLM2's tokenizer and template: rendering each golden conversation
/// must give transformers' rendered text, and its ids transformers' prompt ids.
#[test]
fn chat_template_renders_what_transformers_rendered() {
    let text = model_text();
    let template = text.chat.as_ref().expect("template");
    let golden = golden();
    let mut seen = 0;
    for case in golden["cases"].as_array().unwrap() {
        if case["kind"] != "chat" {
            continue;
        }
        let messages: Vec<TemplateMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| TemplateMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
                ..Default::default()
            })
            .collect();
        let rendered = template.render(&messages, None, true).expect("renders");
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{}",
            case["name"]
        );
        let ids = text.codec.encode(&rendered, false).unwrap();
        let expected: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(ids, expected, "{}", case["name"]);
        seen += 1;
    }
    assert!(seen >= 2, "the golden file has chat cases");
}

/// Pushing ids one at a time must give, in total, exactly what decoding them all at once
/// gives, and never a replacement character from a split UTF-8 sequence.
#[test]
fn incremental_decoding_concatenates_to_the_full_decode() {
    let text = model_text();
    let golden = golden();
    let mut id_lists: Vec<Vec<u32>> = Vec::new();
    for case in golden["tokenizer_cases"].as_array().unwrap() {
        id_lists.push(serde_json::from_value(case["ids"].clone()).unwrap());
    }
    for case in golden["cases"].as_array().unwrap() {
        id_lists.push(serde_json::from_value(case["greedy_ids"].clone()).unwrap());
    }
    for ids in id_lists {
        let mut decoder = IncrementalDecoder::default();
        let mut out = String::new();
        for &id in &ids {
            let piece = decoder.push(&text.codec, id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{ids:?}");
            out.push_str(&piece);
        }
        out.push_str(&decoder.flush(&text.codec).unwrap());
        assert_eq!(out, text.codec.decode(&ids, true).unwrap(), "{ids:?}");
    }
}
