//! Text in and out of token ids: the artifact's tokenizer (`tokenizers`), incremental
//! detokenization, and stop strings matched on the text as it grows.
//!
//! Incremental detokenization uses the prefix-offset / read-offset scheme of TGI and vLLM: a
//! token's text is the difference between decoding a short window of ids with and without it,
//! so merges across tokens (byte-level pieces of one UTF-8 character, a leading space that a
//! tokenizer drops at the start of a text) come out right, and text that still ends in an
//! incomplete character (`U+FFFD`) is held back until a later token completes it. The
//! concatenation of everything emitted equals `decode(all ids)`.

use std::path::Path;

use thiserror::Error;
use tokenizers::Tokenizer;

/// The tokenizer could not be used.
#[derive(Debug, Error)]
pub enum TextError {
    /// `tokenizer.json` did not load.
    #[error("cannot load the tokenizer {path}: {message}")]
    Load { path: String, message: String },
    /// Encoding or decoding failed.
    #[error("tokenizer failed: {0}")]
    Codec(String),
}

/// The artifact's tokenizer.
#[derive(Debug)]
pub struct TextCodec {
    tokenizer: Tokenizer,
}

impl TextCodec {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, TextError> {
        let tokenizer = Tokenizer::from_file(path).map_err(|e| TextError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Self { tokenizer })
    }

    /// Token ids of `text`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::Codec(e.to_string()))
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Codec(e.to_string()))
    }

    /// The size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of a token string (e.g. a special token), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }
}

/// Turns a stream of ids into a stream of stable text pieces.
#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Adds one id; returns the text that is now stable (possibly empty).
    pub fn push(&mut self, codec: &TextCodec, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let prefix = codec.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = codec.decode(&self.ids[self.prefix_offset..], true)?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let piece = full[prefix.len()..].to_owned();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// The text held back so far (an incomplete character at the end of the output).
    pub fn flush(&mut self, codec: &TextCodec) -> Result<String, TextError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = codec.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = codec.decode(&self.ids[self.prefix_offset..], true)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_owned())
    }
}

/// Finds stop strings in text that arrives in pieces, never releasing text that a stop string
/// could still cover.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What one piece of text gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    /// Text that is safe to send.
    pub text: String,
    /// Whether a stop string was found (the text stops before it; the request is over).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (none: text passes straight through).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
        }
    }

    /// Adds a piece of text.
    pub fn push(&mut self, piece: &str) -> Matched {
        self.pending.push_str(piece);
        let earliest = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = earliest {
            let text = self.pending[..at].to_owned();
            self.pending.clear();
            return Matched {
                text,
                stopped: true,
            };
        }
        let hold = self.held_suffix_len();
        let release = self.pending.len() - hold;
        let text = self.pending[..release].to_owned();
        self.pending.drain(..release);
        Matched {
            text,
            stopped: false,
        }
    }

    /// Releases the held text when the request ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// The longest suffix of the pending text that begins some stop string.
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        p.char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&p[i..])))
            .map_or(0, |i| p.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop matcher fed in every split of the text must give what one search over the whole
    /// text gives.
    #[test]
    fn stop_matcher_agrees_with_a_whole_text_search_for_every_split() {
        let cases = [
            ("hello world, stop here", vec!["stop"], "hello world, "),
            ("abcabcabd tail", vec!["abcabd"], "abc"),
            ("no match at all", vec!["zz", "q"], "no match at all"),
            (
                "ends with a partial sto",
                vec!["stop"],
                "ends with a partial sto",
            ),
            ("héllo wörld", vec!["ö"], "héllo w"),
            ("two stops: B then A", vec!["A", "B"], "two stops: "),
        ];
        for (text, stops, expected) in cases {
            let reference = stops
                .iter()
                .filter_map(|s| text.find(s))
                .min()
                .map_or(text, |i| &text[..i]);
            assert_eq!(reference, expected);
            let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            for &a in &bounds {
                for &b in bounds.iter().filter(|&&b| b >= a) {
                    let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
                    let mut out = String::new();
                    let mut stopped = false;
                    for piece in [&text[..a], &text[a..b], &text[b..]] {
                        let r = m.push(piece);
                        out.push_str(&r.text);
                        if r.stopped {
                            stopped = true;
                            break;
                        }
                    }
                    if !stopped {
                        out.push_str(&m.finish());
                    }
                    assert_eq!(out, expected, "text {text:?} split at {a},{b}");
                }
            }
        }
    }
}
