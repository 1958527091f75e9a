//! Text in and out of token ids with the artifact's tokenizer (`tokenizers`), and incremental
//! detokenization for streamed responses.
//!
//! The incremental decoder decodes everything generated so far and emits what is new since the
//! last piece, holding text back while it ends in an incomplete character (`U+FFFD`); the
//! concatenation of the pieces is `decode(all ids)`. Decoding the whole output each token is
//! quadratic in the output's length, which at the context sizes served is small next to a
//! decode step.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::error::{BackendError, Code};

/// The artifact's tokenizer.
#[derive(Debug)]
pub struct Codec {
    tokenizer: Tokenizer,
}

impl Codec {
    /// Loads the `tokenizer.json` the artifact in `dir` lists.
    pub fn from_artifact(artifact: &tlaloc_artifact::Artifact) -> Result<Self, BackendError> {
        let path: PathBuf = artifact
            .manifest()
            .tokenizer
            .files
            .iter()
            .find(|f| f.name == "tokenizer.json")
            .map(|f| artifact.root().join(&f.path))
            .ok_or_else(|| {
                BackendError::invalid(format!(
                    "the artifact {} has no tokenizer.json; re-export it with its tokenizer",
                    artifact.root().display()
                ))
            })?;
        Self::from_file(&path)
    }

    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, BackendError> {
        let tokenizer = Tokenizer::from_file(path).map_err(|e| {
            BackendError::invalid(format!("cannot load the tokenizer {}: {e}", path.display()))
        })?;
        Ok(Self { tokenizer })
    }

    /// Token ids of `text`, with the tokenizer's special tokens added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        self.tokenizer
            .encode_fast(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| BackendError::new(Code::Internal, format!("tokenizer failed: {e}")))
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| BackendError::new(Code::Internal, format!("tokenizer failed: {e}")))
    }
}

/// Turns generated ids into stable text pieces.
#[derive(Debug, Default)]
pub struct IncrementalText {
    ids: Vec<u32>,
    emitted: usize,
}

impl IncrementalText {
    /// Adds `id`; returns the text now stable (possibly empty).
    pub fn push(&mut self, codec: &Codec, id: u32) -> Result<String, BackendError> {
        self.ids.push(id);
        let text = codec.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || !text.is_char_boundary(self.emitted.min(text.len())) {
            return Ok(String::new());
        }
        let piece = text.get(self.emitted..).unwrap_or_default().to_owned();
        self.emitted = self.emitted.max(text.len());
        Ok(piece)
    }

    /// Whatever is held back (at the end of the output).
    pub fn flush(&mut self, codec: &Codec) -> Result<String, BackendError> {
        let text = codec.decode(&self.ids)?;
        let piece = text.get(self.emitted..).unwrap_or_default().to_owned();
        self.emitted = self.emitted.max(text.len());
        Ok(piece)
    }

    /// Every id pushed.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
