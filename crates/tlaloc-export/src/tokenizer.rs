//! Tokenizer files for an artifact: `tokenizer.json`, `tokenizer_config.json` (with the chat
//! template and special tokens) and `generation_config.json`. A Hugging Face directory supplies
//! them; for a GGUF file they are rebuilt from `tokenizer.ggml.*` metadata the way transformers'
//! GGUF tokenizer conversion does for byte-level BPE vocabularies (`byte_level_tokenizer`,
//! `add_gguf_special_tokens`, `set_split_regex`), and for Gemma's SentencePiece vocabularies
//! (`tokenizer.ggml.model` = `llama`, no merges) the way its `gemma_tokenizer` does: a byte-fallback
//! BPE whose merges are recovered from the order of the vocabulary, so that token ids equal
//! transformers'. The merge recovery is written here because the `tokenizers` crate only loads
//! merges, it does not derive them from a vocabulary.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::config::ModelConfig;
use crate::error::{IngestError, Result, io_error};
use crate::gguf::{GgufHeader, MetaValue};

/// The bytes of the tokenizer files an artifact carries.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenizerFiles {
    /// `tokenizer.json` (the `tokenizers` library's format); absent only for a directory that
    /// ships none (token-id-only test fixtures).
    pub tokenizer_json: Option<Vec<u8>>,
    /// `tokenizer_config.json` (special tokens, `chat_template`).
    pub tokenizer_config_json: Vec<u8>,
    /// `generation_config.json` (bos/eos/pad ids).
    pub generation_config_json: Vec<u8>,
    /// Files read from the checkpoint directory to make these (empty for GGUF).
    pub source_file_names: Vec<String>,
}

impl std::fmt::Debug for TokenizerFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerFiles")
            .field(
                "tokenizer_json",
                &self.tokenizer_json.as_ref().map(Vec::len),
            )
            .field(
                "tokenizer_config_json",
                &format_args!("{} bytes", self.tokenizer_config_json.len()),
            )
            .field(
                "generation_config_json",
                &format_args!("{} bytes", self.generation_config_json.len()),
            )
            .field("source_file_names", &self.source_file_names)
            .finish()
    }
}

const TOKENIZER_JSON: &str = "tokenizer.json";
const TOKENIZER_CONFIG_JSON: &str = "tokenizer_config.json";
const GENERATION_CONFIG_JSON: &str = "generation_config.json";
const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";

fn tokenizer_error(reason: impl Into<String>) -> IngestError {
    IngestError::Tokenizer {
        reason: reason.into(),
    }
}

impl TokenizerFiles {
    /// The files present, as `(name an artifact writes it under, bytes)`, in a fixed order.
    pub fn files(&self) -> Vec<(&'static str, &[u8])> {
        let mut files = Vec::with_capacity(3);
        if let Some(json) = &self.tokenizer_json {
            files.push((TOKENIZER_JSON, json.as_slice()));
        }
        files.push((TOKENIZER_CONFIG_JSON, self.tokenizer_config_json.as_slice()));
        files.push((
            GENERATION_CONFIG_JSON,
            self.generation_config_json.as_slice(),
        ));
        files
    }

    /// The names of [`Self::files`].
    pub fn file_names(&self) -> Vec<&'static str> {
        self.files().into_iter().map(|(name, _)| name).collect()
    }

    /// The tokenizer these files describe.
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer> {
        let json = self.tokenizer_json.as_ref().ok_or_else(|| {
            tokenizer_error("this checkpoint has no tokenizer.json; put one beside config.json")
        })?;
        tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| tokenizer_error(format!("tokenizer.json does not load: {e}")))
    }

    /// The Jinja chat template, if the model has one.
    pub fn chat_template(&self) -> Option<String> {
        let config: Value = serde_json::from_slice(&self.tokenizer_config_json).ok()?;
        config.get("chat_template")?.as_str().map(str::to_string)
    }

    /// No tokenizer: an artifact that takes and returns token ids only, with the
    /// `generation_config.json` written from the model config.
    pub fn token_ids_only(config: &ModelConfig) -> Self {
        Self {
            tokenizer_json: None,
            tokenizer_config_json: to_json_bytes(&Value::Object(Map::new())),
            generation_config_json: generation_config(config, None),
            source_file_names: Vec::new(),
        }
    }

    /// Reads the files beside a Hugging Face checkpoint. A `tokenizer.json` that is present must
    /// load; a missing `tokenizer_config.json` or `generation_config.json` is written from the
    /// model config.
    pub fn from_hf_dir(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let mut source_file_names = Vec::new();
        let tokenizer_json = read_optional(dir, TOKENIZER_JSON)?;
        if tokenizer_json.is_some() {
            source_file_names.push(TOKENIZER_JSON.to_string());
        }
        let mut tokenizer_config = match read_optional(dir, TOKENIZER_CONFIG_JSON)? {
            Some(bytes) => {
                source_file_names.push(TOKENIZER_CONFIG_JSON.to_string());
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(Value::Object(map)) => map,
                    _ => {
                        return Err(IngestError::Json {
                            path: dir.join(TOKENIZER_CONFIG_JSON),
                            reason: "expected a JSON object".into(),
                        });
                    }
                }
            }
            None => Map::new(),
        };
        if !tokenizer_config.contains_key("chat_template")
            && let Some(template) = read_optional(dir, CHAT_TEMPLATE_JINJA)?
        {
            source_file_names.push(CHAT_TEMPLATE_JINJA.to_string());
            let template = String::from_utf8(template)
                .map_err(|_| tokenizer_error(format!("{CHAT_TEMPLATE_JINJA} is not UTF-8")))?;
            tokenizer_config.insert("chat_template".into(), Value::String(template));
        }
        let generation_config_json = match read_optional(dir, GENERATION_CONFIG_JSON)? {
            Some(bytes) => {
                source_file_names.push(GENERATION_CONFIG_JSON.to_string());
                bytes
            }
            None => generation_config(config, None),
        };
        let files = Self {
            tokenizer_json,
            tokenizer_config_json: to_json_bytes(&Value::Object(tokenizer_config)),
            generation_config_json,
            source_file_names,
        };
        if files.tokenizer_json.is_some() {
            files.tokenizer()?;
        }
        Ok(files)
    }

    /// Rebuilds the tokenizer files from GGUF metadata (byte-level BPE, `tokenizer.ggml.model`
    /// = `gpt2`).
    pub fn from_gguf(h: &GgufHeader, config: &ModelConfig) -> Result<Self> {
        let model = h.get("tokenizer.ggml.model").and_then(MetaValue::as_str);
        let architecture = h.get("general.architecture").and_then(MetaValue::as_str);
        if model == Some("llama") {
            return match architecture {
                Some("gemma" | "gemma2" | "gemma3") => Self::from_gguf_gemma(h, config),
                other => Err(tokenizer_error(format!(
                    "a SentencePiece vocabulary (tokenizer.ggml.model \"llama\") is rebuilt for \
                     the gemma, gemma2 and gemma3 architectures, not {other:?}; or export from a \
                     directory with a tokenizer.json"
                ))),
            };
        }
        if model != Some("gpt2") {
            return Err(tokenizer_error(format!(
                "tokenizer.ggml.model {model:?} is not supported; \"gpt2\" (byte-level BPE) and \
                 \"llama\" (SentencePiece, Gemma architectures) are; or export from a directory \
                 with a tokenizer.json"
            )));
        }
        let tokens = string_array(h, "tokenizer.ggml.tokens")?;
        let merges = string_array(h, "tokenizer.ggml.merges")?;
        let token_types = token_types(h)?;
        let alphabet = byte_alphabet();
        let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
        let mut vocab = Map::new();
        for (id, token) in tokens.iter().enumerate() {
            let spelled = if in_alphabet(token) {
                token.to_string()
            } else {
                token.bytes().map(|b| alphabet[b as usize]).collect()
            };
            vocab.insert(spelled, json!(id));
        }
        let merges: Vec<Value> = merges
            .iter()
            .map(|m| {
                let parts: Vec<&str> = m.split(' ').collect();
                match parts.as_slice() {
                    [a, b] => Ok(json!([a, b])),
                    _ => Err(tokenizer_error(format!(
                        "merge {m:?} is not two tokens separated by one space"
                    ))),
                }
            })
            .collect::<Result<_>>()?;
        let mut added = Vec::new();
        for (id, (token, &kind)) in tokens.iter().zip(&token_types).enumerate() {
            // 3 is CONTROL (special), 4 USER_DEFINED (whole, not special).
            let special = match kind {
                3 if in_alphabet(token) => true,
                4 => false,
                _ => continue,
            };
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
        let flag = |key: &str| h.get(key).and_then(MetaValue::as_bool);
        let add_prefix_space = flag("tokenizer.ggml.add_space_prefix").unwrap_or(false);
        let pre = h
            .get("tokenizer.ggml.pre")
            .and_then(MetaValue::as_str)
            .unwrap_or("default");
        let pre_tokenizer = pre_tokenizer(pre, add_prefix_space)?;
        let special_name = |key: &str| special_name(h, &tokens, key);
        let bos = special_name("tokenizer.ggml.bos_token_id")?;
        let eos = special_name("tokenizer.ggml.eos_token_id")?;
        let unk = special_name("tokenizer.ggml.unknown_token_id")?;
        let pad = special_name("tokenizer.ggml.padding_token_id")?;
        let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(false);
        let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
        let post_processor = post_processor(
            add_bos.then_some(bos).flatten().zip(config.bos_token_id),
            add_eos
                .then_some(eos)
                .flatten()
                .zip(config.eos_token_ids.first().copied()),
        );
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": "", "end_of_word_suffix": "",
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        });
        let specials = GgufSpecials {
            add_bos,
            add_eos,
            bos,
            eos,
            unk,
            pad,
        };
        Self::from_gguf_parts(h, config, &tokenizer, &specials)
    }

    /// Gemma's SentencePiece vocabulary as transformers' `gemma_tokenizer` rebuilds it: tokens
    /// of two or more spaces respelled with `▁`, merges recovered from the vocabulary with the
    /// file's order as the rank, byte fallback for what the vocabulary lacks, spaces replaced
    /// by `▁` before splitting after each of them, and a decoder that undoes both.
    fn from_gguf_gemma(h: &GgufHeader, config: &ModelConfig) -> Result<Self> {
        let tokens = string_array(h, "tokenizer.ggml.tokens")?;
        let token_types = token_types(h)?;
        let respelled: Vec<String> = tokens
            .iter()
            .map(|t| {
                if t.contains(' ') && t.trim().is_empty() {
                    "\u{2581}".repeat(t.chars().count())
                } else {
                    (*t).to_string()
                }
            })
            .collect();
        let merges = merges_by_rank(&respelled);
        let mut vocab = Map::new();
        for (id, token) in respelled.iter().enumerate() {
            vocab.insert(token.clone(), json!(id));
        }
        let special_name = |key: &str| special_name(h, &tokens, key);
        let bos = special_name("tokenizer.ggml.bos_token_id")?;
        let eos = special_name("tokenizer.ggml.eos_token_id")?;
        let unk = special_name("tokenizer.ggml.unknown_token_id")?;
        let pad = special_name("tokenizer.ggml.padding_token_id")?;
        let flag = |key: &str| h.get(key).and_then(MetaValue::as_bool);
        // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
        let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(true);
        let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
        let mut added = Vec::new();
        let added_token = |id: usize, content: &str, special: bool| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            })
        };
        // 3 is CONTROL (special); 4 USER_DEFINED (whole, not special), kept only where its
        // spelling in the file is also a vocabulary entry after the respelling.
        for (id, (token, &kind)) in tokens.iter().zip(&token_types).enumerate() {
            if kind == 3 {
                added.push(added_token(id, token, true));
            }
        }
        for (token, &kind) in tokens.iter().zip(&token_types) {
            if kind == 4
                && let Some(vocab_id) = vocab.get(*token).and_then(Value::as_u64)
            {
                added.push(added_token(vocab_id as usize, token, false));
            }
        }
        let post_processor = sentencepiece_post_processor(
            add_bos.then_some(bos).flatten().zip(config.bos_token_id),
            add_eos
                .then_some(eos)
                .flatten()
                .zip(config.eos_token_ids.first().copied()),
        );
        let pre = h.get("tokenizer.ggml.pre").and_then(MetaValue::as_str);
        let pre_tokenizer = match pre.and_then(split_regex) {
            Some(split) => byte_level_split(split),
            None => json!({
                "type": "Split", "pattern": {"String": " "},
                "behavior": "MergedWithPrevious", "invert": false,
            }),
        };
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ]},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": unk.unwrap_or("<unk>"),
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        });
        let specials = GgufSpecials {
            add_bos,
            add_eos,
            bos,
            eos,
            unk,
            pad,
        };
        Self::from_gguf_parts(h, config, &tokenizer, &specials)
    }

    fn from_gguf_parts(
        h: &GgufHeader,
        config: &ModelConfig,
        tokenizer: &Value,
        specials: &GgufSpecials<'_>,
    ) -> Result<Self> {
        let mut tokenizer_config = Map::new();
        tokenizer_config.insert("add_bos_token".into(), json!(specials.add_bos));
        tokenizer_config.insert("add_eos_token".into(), json!(specials.add_eos));
        for (key, value) in [
            ("bos_token", specials.bos),
            ("eos_token", specials.eos),
            ("unk_token", specials.unk),
            ("pad_token", specials.pad),
        ] {
            tokenizer_config.insert(key.into(), json!(value));
        }
        if let Some(template) = h.get("tokenizer.chat_template").and_then(MetaValue::as_str) {
            tokenizer_config.insert("chat_template".into(), json!(template));
        }
        tokenizer_config.insert("clean_up_tokenization_spaces".into(), json!(false));
        tokenizer_config.insert(
            "model_max_length".into(),
            json!(config.max_position_embeddings),
        );
        let pad_id = h
            .get("tokenizer.ggml.padding_token_id")
            .and_then(MetaValue::as_u64);
        let files = Self {
            tokenizer_json: Some(to_json_bytes(tokenizer)),
            tokenizer_config_json: to_json_bytes(&Value::Object(tokenizer_config)),
            generation_config_json: generation_config(config, pad_id),
            source_file_names: Vec::new(),
        };
        files.tokenizer()?;
        Ok(files)
    }
}

/// The special tokens and flags a GGUF names, as `tokenizer_config.json` writes them.
struct GgufSpecials<'a> {
    add_bos: bool,
    add_eos: bool,
    bos: Option<&'a str>,
    eos: Option<&'a str>,
    unk: Option<&'a str>,
    pad: Option<&'a str>,
}

fn token_types(h: &GgufHeader) -> Result<Vec<i64>> {
    match h.get("tokenizer.ggml.token_type") {
        None => Ok(Vec::new()),
        Some(MetaValue::Array(items)) => items
            .iter()
            .map(|v| match v {
                MetaValue::I32(t) => Ok(i64::from(*t)),
                other => Err(tokenizer_error(format!(
                    "tokenizer.ggml.token_type holds {other:?}; INT32 values are accepted"
                ))),
            })
            .collect(),
        Some(other) => Err(tokenizer_error(format!(
            "tokenizer.ggml.token_type is {other:?}; an INT32 array is accepted"
        ))),
    }
}

fn special_name<'a>(h: &GgufHeader, tokens: &[&'a str], key: &str) -> Result<Option<&'a str>> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => {
            let id = v.as_u64().and_then(|i| usize::try_from(i).ok());
            match id.and_then(|i| tokens.get(i)) {
                Some(t) => Ok(Some(t)),
                None => Err(tokenizer_error(format!("{key} = {v:?} is not a token id"))),
            }
        }
    }
}

/// The merges a merge-less vocabulary implies, ranked by the order of the vocabulary: every
/// split of a token into two tokens of the vocabulary is a merge, earlier tokens' merges first,
/// and within one token the longer left part first (transformers' `generate_merges` with
/// `-position` as the score). Where a spelling repeats, the later id stands, as in a Python dict.
fn merges_by_rank(tokens: &[String]) -> Vec<Value> {
    use std::collections::HashMap;
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        if ids.insert(token.as_str(), id).is_none() {
            order.push(token.as_str());
        }
    }
    // (rank of the merged token, left part length in chars, left, right)
    let mut merges: Vec<(usize, usize, &str, &str)> = Vec::new();
    for token in order {
        let rank = ids[token];
        let mut local: Vec<(usize, usize, &str, &str)> = token
            .char_indices()
            .skip(1)
            .enumerate()
            .filter_map(|(i, (at, _))| {
                let (left, right) = token.split_at(at);
                (ids.contains_key(left) && ids.contains_key(right)).then_some((
                    rank,
                    i + 1,
                    left,
                    right,
                ))
            })
            .collect();
        local.sort_by_key(|&(_, _, l, r)| (ids[l], ids[r]));
        merges.extend(local);
    }
    // Higher score is earlier: a lower position, then a longer left part (the right part's
    // length follows from it); a stable sort keeps ties in the order they were found.
    merges.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    merges
        .into_iter()
        .map(|(_, _, l, r)| json!([l, r]))
        .collect()
}

fn read_optional(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let path = dir.join(name);
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read(&path).map(Some).map_err(io_error(&path))
}

fn to_json_bytes(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

fn generation_config(config: &ModelConfig, pad: Option<u64>) -> Vec<u8> {
    let mut map = Map::new();
    if let Some(bos) = config.bos_token_id {
        map.insert("bos_token_id".into(), json!(bos));
    }
    match config.eos_token_ids.as_slice() {
        [] => {}
        [one] => {
            map.insert("eos_token_id".into(), json!(one));
        }
        many => {
            map.insert("eos_token_id".into(), json!(many));
        }
    }
    if let Some(pad) = pad {
        map.insert("pad_token_id".into(), json!(pad));
    }
    to_json_bytes(&Value::Object(map))
}

fn string_array<'a>(h: &'a GgufHeader, key: &str) -> Result<Vec<&'a str>> {
    let items = h
        .get(key)
        .and_then(MetaValue::as_array)
        .ok_or_else(|| tokenizer_error(format!("{key} is missing; a string array is required")))?;
    items
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| tokenizer_error(format!("{key} holds {v:?}; strings are accepted")))
        })
        .collect()
}

/// GPT-2's printable spelling of the 256 byte values (`bytes_to_unicode`).
fn byte_alphabet() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).unwrap_or('\u{fffd}')
        })
        .collect()
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer for `tokenizer.ggml.pre`: GPT-2's own split for GPT-2-style vocabularies,
/// the named split followed by a byte-level mapping for the others transformers knows.
fn pre_tokenizer(pre: &str, add_prefix_space: bool) -> Result<Value> {
    if let "default" | "gpt-2" | "smollm" | "starcoder" = pre {
        return Ok(json!({
            "type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": true, "use_regex": true,
        }));
    }
    let split = split_regex(pre).ok_or_else(|| {
        tokenizer_error(format!(
            "tokenizer.ggml.pre {pre:?} is not supported; supported: default, gpt-2, smollm, \
             starcoder, llama3, llama-v3, llama-bpe, smaug-bpe, dbrx, qwen2, deepseek-r1-qwen"
        ))
    })?;
    Ok(byte_level_split(split))
}

/// The split regex transformers applies for a `tokenizer.ggml.pre` it knows.
fn split_regex(pre: &str) -> Option<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "dbrx" => Some(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
        _ => None,
    }
}

fn byte_level_split(split: &str) -> Value {
    json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ],
    })
}

fn post_processor(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    let special = |name: &str| json!({"SpecialToken": {"id": name, "type_id": 0}});
    if let Some((name, id)) = bos {
        single.push(special(name));
        pair.push(special(name));
        specials.insert(
            name.into(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some((name, id)) = eos {
        single.push(special(name));
        pair.push(special(name));
        specials.insert(
            name.into(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// BOS before each sequence (the second with type id 1), EOS after each, as transformers'
/// SentencePiece tokenizers write `add_bos_token` / `add_eos_token`.
fn sentencepiece_post_processor(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    let special =
        |name: &str, type_id: u32| json!({"SpecialToken": {"id": name, "type_id": type_id}});
    for (sequence, type_id) in [("A", 0u32), ("B", 1)] {
        let items = if sequence == "A" {
            &mut single
        } else {
            &mut pair
        };
        if let Some((name, _)) = bos {
            items.push(special(name, type_id));
        }
        items.push(json!({"Sequence": {"id": sequence, "type_id": type_id}}));
        if let Some((name, _)) = eos {
            items.push(special(name, type_id));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for (name, id) in bos.into_iter().chain(eos) {
        specials.insert(
            name.into(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}
