//! Per-request token constraints: which tokens may come next (a grammar, a JSON schema, a
//! regex, a fixed choice), applied to the logits before sampling, for greedy and sampled rows
//! alike.
//!
//! The runtime owns the seam, not the grammar engine: a [`TokenConstraint`] is built by the
//! caller (the server compiles JSON schemas and grammars with llguidance) and handed to the
//! engine inside a [`Constraint`]. The scheduler asks it for a [`TokenMask`] before each token
//! of its row, sets every token outside the mask to `-inf`, samples, and commits the chosen
//! token back. A constrained row needs its logits on the host, so it never joins a decode chain
//! (the in-graph argmax knows no mask); the mask costs one host round trip per token, measured
//! in docs/benchmarks.md.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use thiserror::Error;

/// The set of tokens allowed next: one bit per token id, `1` allowed, in `u32` words (bit
/// `t % 32` of word `t / 32`, the layout llguidance's masks use). Ids past the words are not
/// allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask from its words.
    pub fn from_words(words: Vec<u32>) -> Self {
        Self { words }
    }

    /// A mask allowing exactly `tokens`.
    pub fn only(tokens: &[u32]) -> Self {
        let len = tokens
            .iter()
            .map(|&t| t as usize / 32 + 1)
            .max()
            .unwrap_or(0);
        let mut words = vec![0u32; len];
        for &t in tokens {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        Self { words }
    }

    /// Whether `token` may come next.
    pub fn allows(&self, token: u32) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| w & (1 << (token % 32)) != 0)
    }

    /// Whether no token of `0..vocab` is allowed.
    pub fn is_empty_within(&self, vocab: usize) -> bool {
        (0..vocab as u32).all(|t| !self.allows(t))
    }

    /// Sets every logit whose token the mask does not allow to `-inf`.
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (b, v) in chunk.iter_mut().enumerate() {
                if word & (1 << b) == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// A constraint that failed (its grammar reached a state it cannot leave, or it was handed a
/// token it does not allow).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("token constraint failed: {0}")]
pub struct ConstraintError(pub String);

/// Decides which tokens a request may generate, one token at a time.
pub trait TokenConstraint: Send {
    /// The tokens allowed next (an end-of-sequence token among them when the constraint is
    /// complete and may end there).
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError>;
    /// Advances past `token`, the one chosen from the last mask.
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// Whether nothing may follow: the request ends with the token just committed.
    fn is_finished(&self) -> bool;
}

/// A request's constraint, as the request carries it. Clones share one state: a constraint
/// belongs to one request, and the clone exists only because requests are values.
#[derive(Clone)]
pub struct Constraint(Arc<Mutex<Box<dyn TokenConstraint>>>);

impl Constraint {
    /// Wraps a constraint for a request.
    pub fn new(constraint: impl TokenConstraint + 'static) -> Self {
        Self(Arc::new(Mutex::new(Box::new(constraint))))
    }

    /// The constraint itself, for whoever drives it (the scheduler; a test).
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn TokenConstraint>> {
        // A panic inside a constraint leaves its state as it was; the request still ends.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_allows_its_tokens_only_and_masks_the_rest_to_minus_infinity() {
        let mask = TokenMask::only(&[1, 33, 64]);
        let mut logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        mask.apply(&mut logits);
        for (t, v) in logits.iter().enumerate() {
            let allowed = [1, 33, 64].contains(&t);
            assert_eq!(mask.allows(t as u32), allowed);
            assert_eq!(v.is_finite(), allowed, "token {t}");
        }
        assert!(!mask.allows(1000));
        assert!(TokenMask::only(&[]).is_empty_within(70));
        assert!(!mask.is_empty_within(70));
    }
}
