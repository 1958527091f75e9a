//! `sampling_parameters`: the JSON object of Triton's vLLM backend (values as JSON numbers or as
//! strings of them, as its clients send), read into the engine's sampling and budget fields.
//! Every key is known or refused by name.

use serde_json::{Map, Value};
use tlaloc_runtime::{SamplingParams, StopParams};

use crate::error::BackendError;

/// The budget when `max_tokens` is not given (vLLM's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// The keys `sampling_parameters` may hold.
pub const KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "ignore_eos",
    "stop_token_ids",
];

/// What `sampling_parameters` sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// Stop tokens.
    pub stop: StopParams,
    /// The token budget.
    pub max_tokens: usize,
    /// Do not stop on end-of-sequence tokens.
    pub ignore_eos: bool,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::greedy(),
            stop: StopParams::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
            ignore_eos: false,
        }
    }
}

/// Parses `sampling_parameters` (absent or empty: greedy, 16 tokens).
pub fn parse(text: Option<&str>) -> Result<Sampling, BackendError> {
    let mut out = Sampling::default();
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        return Ok(out);
    };
    let object: Map<String, Value> = serde_json::from_str(text).map_err(|e| {
        BackendError::invalid(format!(
            "sampling_parameters refused: not a JSON object ({e}); send e.g. {{\"temperature\": 0, \"max_tokens\": 32}}"
        ))
    })?;
    for (key, value) in &object {
        match key.as_str() {
            "temperature" => out.sampling.temperature = float(key, value)? as f32,
            "top_p" => out.sampling.top_p = float(key, value)? as f32,
            "top_k" => {
                let k = float(key, value)?;
                // vLLM spells "all tokens" as -1 (or 0).
                out.sampling.top_k = (k >= 1.0).then_some(k as usize);
            }
            "min_p" => out.sampling.min_p = float(key, value)? as f32,
            "seed" => out.sampling.seed = Some(whole(key, value)?),
            "max_tokens" => out.max_tokens = whole(key, value)? as usize,
            "repetition_penalty" => out.sampling.repetition_penalty = float(key, value)? as f32,
            "presence_penalty" => out.sampling.presence_penalty = float(key, value)? as f32,
            "frequency_penalty" => out.sampling.frequency_penalty = float(key, value)? as f32,
            "ignore_eos" => out.ignore_eos = boolean(key, value)?,
            "stop_token_ids" => {
                let ids = value
                    .as_array()
                    .ok_or_else(|| wrong(key, value, "a list of token ids"))?;
                out.stop.stop_token_ids = ids
                    .iter()
                    .map(|id| whole(key, id).map(|id| id as u32))
                    .collect::<Result<_, _>>()?;
            }
            other => {
                return Err(BackendError::invalid(format!(
                    "sampling_parameters key `{other}` refused; this backend takes {}",
                    KEYS.join(", ")
                )));
            }
        }
    }
    Ok(out)
}

fn wrong(key: &str, value: &Value, accepted: &str) -> BackendError {
    BackendError::invalid(format!(
        "sampling_parameters `{key}` = {value} refused: {accepted}"
    ))
}

fn float(key: &str, value: &Value) -> Result<f64, BackendError> {
    value
        .as_f64()
        .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(|| wrong(key, value, "a number"))
}

fn whole(key: &str, value: &Value) -> Result<u64, BackendError> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
        .ok_or_else(|| wrong(key, value, "a whole number, 0 or more"))
}

fn boolean(key: &str, value: &Value) -> Result<bool, BackendError> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(wrong(key, value, "true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_may_come_as_strings_and_unknown_keys_are_refused_by_name() {
        let s = parse(Some(
            r#"{"temperature":"0.5","top_k":-1,"max_tokens":"8","seed":3,"ignore_eos":"true"}"#,
        ))
        .unwrap();
        assert_eq!(s.sampling.temperature, 0.5);
        assert_eq!(s.sampling.top_k, None);
        assert_eq!(
            (s.max_tokens, s.sampling.seed, s.ignore_eos),
            (8, Some(3), true)
        );
        assert_eq!(parse(None).unwrap(), Sampling::default());
        let e = parse(Some(r#"{"best_of":2}"#)).unwrap_err();
        assert!(e.message.contains("`best_of` refused"), "{}", e.message);
        let e = parse(Some(r#"{"max_tokens":-3}"#)).unwrap_err();
        assert!(
            e.message.contains("`max_tokens` = -3 refused"),
            "{}",
            e.message
        );
        assert!(parse(Some("[1]")).is_err());
    }
}
