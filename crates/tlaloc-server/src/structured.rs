//! Structured outputs: `response_format` (`json_object`, `json_schema`) and vLLM's
//! `structured_outputs` (`json`, `regex`, `choice`, `grammar`) compiled with llguidance into a
//! per-request [`TokenConstraint`] the engine applies before sampling.
//!
//! llguidance rather than outlines-core: it is a Rust crate that computes a mask from the
//! grammar's current state (23 µs median per token on SmolLM2's vocabulary, docs/benchmarks.md)
//! with no ahead-of-time index over the vocabulary (outlines-core compiles one per regex), it
//! takes JSON schemas, regexes and Lark grammars through one entry point, and vLLM, SGLang and
//! mistral.rs serve it. Its tokenizer side (`toktrie_hf_tokenizers`) reads
//! the artifact's `tokenizer.json` with its own `tokenizers` release (0.21; the server's text
//! side is on 0.22): the vocabulary's bytes are all it takes from it.
//!
//! The parser factory (the token trie over the vocabulary) is built once, on the first
//! constrained request. Each distinct grammar is compiled once and kept in a bounded LRU
//! cache; a request gets a fresh copy of the compiled parser. JSON is generated compact (no
//! free whitespace between tokens): a small model given free whitespace can fill its budget
//! with newlines and never close the object.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory, TokenParser};
use lru::LruCache;
use serde::Deserialize;
use tlaloc_runtime::{Constraint, ConstraintError, TokenConstraint, TokenMask};
use utoipa::ToSchema;

use crate::error::ApiError;

/// Distinct grammars kept compiled.
pub const GRAMMAR_CACHE_ENTRIES: usize = 64;

/// `response_format` (OpenAI).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: String,
    /// What the schema is for (not used).
    pub description: Option<String>,
    /// The JSON schema; leaving it out accepts any JSON value.
    #[schema(value_type = Object)]
    pub schema: Option<serde_json::Value>,
    /// Output always follows the schema here; `strict` is accepted either way.
    pub strict: Option<bool>,
}

/// `structured_outputs` (vLLM): exactly one of its fields.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or a string holding one).
    #[schema(value_type = Object)]
    pub json: Option<serde_json::Value>,
    /// A regular expression the whole output matches.
    pub regex: Option<String>,
    /// One of these strings, exactly.
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (llguidance's dialect, with `start` as its first rule; GBNF's `::=` is
    /// not read).
    pub grammar: Option<String>,
    /// Any JSON object.
    pub json_object: Option<bool>,
}

/// What a request asks its output to follow, with the field that asked (for refusals).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GrammarSpec {
    field: String,
    /// `json:`, `regex:` or `lark:` and the text; the cache key.
    key: String,
}

impl GrammarSpec {
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        let (kind, text) = self.key.split_once(':').expect("keys are tagged");
        Ok(match kind {
            "json" => {
                let schema: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| e.to_string())?;
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            "regex" => TopLevelGrammar::from_regex(text),
            _ => TopLevelGrammar::from_lark(text.to_owned()),
        })
    }
}

/// A schema with llguidance's options for compact JSON, unless it sets its own.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut()
        && !object.contains_key("x-guidance")
    {
        object.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false}),
        );
    }
    schema
}

/// The spec a request's `response_format` and `structured_outputs` ask for, if any; both at
/// once, or a `structured_outputs` with other than one field, is refused.
pub fn requested(
    response_format: Option<&ResponseFormat>,
    structured: Option<&StructuredOutputs>,
) -> Result<Option<(String, String)>, ApiError> {
    let from_format = match response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some((
            "response_format".to_owned(),
            format!("json:{}", serde_json::json!({"type": "object"})),
        )),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().unwrap_or(serde_json::json!({}));
            if !schema.is_object() && !schema.is_boolean() {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` refused: a JSON schema is an object",
                ));
            }
            Some((
                "response_format.json_schema.schema".to_owned(),
                format!("json:{schema}"),
            ))
        }
    };
    let from_structured = match structured {
        None => None,
        Some(s) => Some(structured_spec(s)?),
    };
    match (from_format, from_structured) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "structured_outputs",
            "`structured_outputs` refused together with a `response_format` of JSON: send one",
        )),
        (a, b) => Ok(a.or(b)),
    }
}

fn structured_spec(s: &StructuredOutputs) -> Result<(String, String), ApiError> {
    let mut specs = Vec::new();
    if let Some(json) = &s.json {
        let schema = match json {
            serde_json::Value::String(text) => serde_json::from_str(text).map_err(|e| {
                ApiError::invalid(
                    "structured_outputs.json",
                    format!("`structured_outputs.json` refused: not JSON: {e}"),
                )
            })?,
            other => other.clone(),
        };
        specs.push(("structured_outputs.json", format!("json:{schema}")));
    }
    if let Some(regex) = &s.regex {
        specs.push(("structured_outputs.regex", format!("regex:{regex}")));
    }
    if let Some(choice) = &s.choice {
        if choice.is_empty() {
            return Err(ApiError::invalid(
                "structured_outputs.choice",
                "an empty `structured_outputs.choice` refused: list at least one string",
            ));
        }
        let alternatives: Vec<String> = choice.iter().map(|c| regex_escape(c)).collect();
        specs.push((
            "structured_outputs.choice",
            format!("regex:({})", alternatives.join("|")),
        ));
    }
    if let Some(grammar) = &s.grammar {
        specs.push(("structured_outputs.grammar", format!("lark:{grammar}")));
    }
    if s.json_object == Some(true) {
        specs.push((
            "structured_outputs.json_object",
            format!("json:{}", serde_json::json!({"type": "object"})),
        ));
    }
    match specs.len() {
        1 => {
            let (field, key) = specs.remove(0);
            Ok((field.to_owned(), key))
        }
        n => Err(ApiError::invalid(
            "structured_outputs",
            format!(
                "`structured_outputs` with {n} kinds refused: send exactly one of json, regex, choice, grammar, json_object"
            ),
        )),
    }
}

fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The grammars of one served model: its parser factory, built on first use, and the compiled
/// grammars it has seen.
pub struct Grammars {
    tokenizer_json: PathBuf,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    compiled: Mutex<LruCache<String, TokenParser>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("tokenizer_json", &self.tokenizer_json)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// Grammars over the vocabulary of `tokenizer_json`.
    pub fn new(tokenizer_json: PathBuf) -> Self {
        Self {
            tokenizer_json,
            factory: OnceLock::new(),
            compiled: Mutex::new(LruCache::new(
                NonZeroUsize::new(GRAMMAR_CACHE_ENTRIES).expect("a positive capacity"),
            )),
        }
    }

    fn factory(&self, vocab_size: usize, eos: &[u32]) -> Result<Arc<ParserFactory>, ApiError> {
        let built = self.factory.get_or_init(|| {
            let bytes = std::fs::read(&self.tokenizer_json).map_err(|e| e.to_string())?;
            let mut tokenizer = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(&bytes)
                .map_err(|e| e.to_string())?;
            if !eos.is_empty() {
                tokenizer.set_eos_tokens(eos);
            }
            let env = tokenizer
                .into_tok_env(Some(vocab_size))
                .map_err(|e| e.to_string())?;
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok(Arc::new(factory))
        });
        built.clone().map_err(|e| {
            ApiError::internal(format!(
                "structured outputs are unavailable: the tokenizer did not load into llguidance: {e}"
            ))
        })
    }

    /// The compiled parser for `key` (from the cache, or compiled now and cached); a grammar
    /// llguidance refuses is a 400 naming `field`.
    fn parser(
        &self,
        field: &str,
        key: &str,
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<TokenParser, ApiError> {
        let lock = || self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(parser) = lock().get(key) {
            return Ok(parser.deep_clone());
        }
        let factory = self.factory(vocab_size, eos)?;
        let spec = GrammarSpec {
            field: field.to_owned(),
            key: key.to_owned(),
        };
        let refused = |e: String| {
            ApiError::invalid(
                field,
                format!("`{field}` refused by the grammar compiler: {e}"),
            )
        };
        let grammar = spec.grammar().map_err(refused)?;
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| refused(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser.deep_clone()));
        if let Some(e) = matcher.get_error() {
            return Err(refused(e));
        }
        lock().put(key.to_owned(), parser.deep_clone());
        Ok(parser)
    }

    /// Distinct grammars compiled and kept now.
    pub fn cached(&self) -> usize {
        self.compiled.lock().map_or(0, |c| c.len())
    }

    /// The compiled grammar a request asking for `spec` (from [`requested`]) runs under.
    pub fn compile(
        &self,
        spec: &(String, String),
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<CompiledGrammar, ApiError> {
        Ok(CompiledGrammar {
            parser: self.parser(&spec.0, &spec.1, vocab_size, eos)?,
            eos: eos.to_vec(),
        })
    }
}

/// A grammar compiled for one request; each of its choices gets its own matcher.
#[derive(Clone)]
pub struct CompiledGrammar {
    parser: TokenParser,
    eos: Vec<u32>,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledGrammar")
    }
}

impl CompiledGrammar {
    /// A fresh constraint for one choice, as the engine takes it.
    pub fn constraint(&self) -> Constraint {
        Constraint::new(GrammarConstraint {
            matcher: Matcher::new(Ok(self.parser.deep_clone())),
            eos: self.eos.clone(),
            ended: false,
        })
    }
}

/// One choice's constraint: an llguidance matcher over the compiled grammar.
struct GrammarConstraint {
    matcher: Matcher,
    eos: Vec<u32>,
    ended: bool,
}

impl TokenConstraint for GrammarConstraint {
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError(e.to_string()))?;
        Ok(TokenMask::from_words(mask.as_slice().to_vec()))
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.eos.contains(&token) {
            // The grammar allowed end-of-sequence, so it is complete: the request ends here.
            self.ended = true;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError(e.to_string()))
    }

    fn is_finished(&self) -> bool {
        self.ended || self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammars() -> (Grammars, tokenizers::Tokenizer) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/fixtures/tiny-llama-tied/tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
        (Grammars::new(path), tokenizer)
    }

    fn id(tokenizer: &tokenizers::Tokenizer, text: &str) -> u32 {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0]
    }

    #[test]
    fn a_schema_is_compiled_once_and_its_mask_allows_only_what_the_schema_can_start_with() {
        let (grammars, tokenizer) = grammars();
        let vocab = tokenizer.get_vocab_size(true);
        let eos = [id(&tokenizer, "<|im_end|>")];
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false});
        let spec = (
            "response_format.json_schema.schema".to_owned(),
            format!("json:{schema}"),
        );
        let compiled = grammars.compile(&spec, vocab, &eos).unwrap();
        grammars.compile(&spec, vocab, &eos).unwrap();
        assert_eq!(grammars.cached(), 1);

        let constraint = compiled.constraint();
        let mut c = constraint.lock();
        let mask = c.next_mask().unwrap();
        let reply = tokenizer
            .encode("{\"a\":7}", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert!(mask.allows(reply[0]));
        for text in ["hello", "[", "<|im_end|>"] {
            assert!(!mask.allows(id(&tokenizer, text)), "{text:?} allowed first");
        }
        // `{"a":7}` token by token, then the grammar is complete and only eos may follow.
        for piece in reply {
            assert!(c.next_mask().unwrap().allows(piece));
            c.commit(piece).unwrap();
        }
        assert!(c.is_finished() || c.next_mask().unwrap().allows(eos[0]));
    }

    /// The per-token cost of the mask over SmolLM2's vocabulary (the fixture's tokenizer is
    /// SmolLM2's): compute and copy the mask, then commit, for each token of a reply to a JSON
    /// schema. Not a pass/fail test; docs/benchmarks.md reports its numbers:
    /// `cargo test --release -p tlaloc-server --lib mask_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn mask_cost() {
        let (grammars, tokenizer) = grammars();
        let vocab = tokenizer.get_vocab_size(true);
        let eos = [id(&tokenizer, "<|im_end|>")];
        let schema = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 16}},
            "required": ["name", "age", "city"], "additionalProperties": false});
        let spec = ("s".to_owned(), format!("json:{schema}"));
        let started = std::time::Instant::now();
        let compiled = grammars.compile(&spec, vocab, &eos).unwrap();
        let first_compile = started.elapsed();
        let started = std::time::Instant::now();
        grammars.compile(&spec, vocab, &eos).unwrap();
        let cached_compile = started.elapsed();
        let reply = r#"{"name":"Alice Smith","age":34,"city":"Paris"}"#;
        let ids = tokenizer.encode(reply, false).unwrap().get_ids().to_vec();
        let rounds = 20;
        let mut per_token = Vec::new();
        for _ in 0..rounds {
            let constraint = compiled.constraint();
            let mut c = constraint.lock();
            for &t in &ids {
                let started = std::time::Instant::now();
                let mask = c.next_mask().unwrap();
                assert!(mask.allows(t));
                c.commit(t).unwrap();
                per_token.push(started.elapsed().as_secs_f64());
            }
        }
        per_token.sort_by(f64::total_cmp);
        let mean = per_token.iter().sum::<f64>() / per_token.len() as f64;
        println!(
            "first build (trie + compile): {:.1} ms; cached compile: {:.3} ms; {} tokens x {rounds}: mask+commit mean {:.1} us, p50 {:.1} us, p99 {:.1} us",
            first_compile.as_secs_f64() * 1e3,
            cached_compile.as_secs_f64() * 1e3,
            ids.len(),
            mean * 1e6,
            per_token[per_token.len() / 2] * 1e6,
            per_token[per_token.len() * 99 / 100] * 1e6,
        );
    }

    #[test]
    fn a_grammar_llguidance_refuses_is_a_400_naming_the_field() {
        let (grammars, tokenizer) = grammars();
        let vocab = tokenizer.get_vocab_size(true);
        for (field, key) in [
            ("structured_outputs.regex", "regex:(unclosed"),
            ("structured_outputs.grammar", "lark:start: nowhere"),
            (
                "response_format.json_schema.schema",
                r#"json:{"type": "object", "properties": {"a": {"type": "nonsense"}}}"#,
            ),
        ] {
            let e = grammars
                .compile(&(field.to_owned(), key.to_owned()), vocab, &[0])
                .unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
        }
        assert_eq!(grammars.cached(), 0);
    }

    #[test]
    fn requests_name_the_field_they_constrain_and_refuse_two_at_once() {
        let format = ResponseFormat::JsonObject;
        let so = StructuredOutputs {
            regex: Some("a+".into()),
            ..Default::default()
        };
        assert_eq!(
            requested(Some(&format), None).unwrap().unwrap().0,
            "response_format"
        );
        assert_eq!(
            requested(None, Some(&so)).unwrap().unwrap(),
            ("structured_outputs.regex".into(), "regex:a+".into())
        );
        assert!(requested(Some(&format), Some(&so)).is_err());
        assert!(
            requested(Some(&ResponseFormat::Text), None)
                .unwrap()
                .is_none()
        );
        let choice = StructuredOutputs {
            choice: Some(vec!["a.b".into(), "c|d".into()]),
            ..Default::default()
        };
        assert_eq!(
            requested(None, Some(&choice)).unwrap().unwrap().1,
            r"regex:(a\.b|c\|d)"
        );
    }
}
