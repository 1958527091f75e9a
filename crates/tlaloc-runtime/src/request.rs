//! What a caller asks of the engine and what it gets back: the request, its one validation
//! against the model's shape (refusals by name), and the finish, usage and timings of a
//! finished request.
//!
//! A request is validated once, where it is submitted; the scheduler takes only a
//! [`ValidatedRequest`], which nothing else can make.

use std::time::Duration;

use thiserror::Error;

use crate::constraint::Constraint;
use crate::executor::ModelShape;
use crate::sampling::{Sampled, SamplingParams};

/// Identifies a request for its whole life (abort, events).
pub type RequestId = u64;

/// When a request stops, besides its token budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopParams {
    /// Stop after emitting any of these tokens.
    pub stop_token_ids: Vec<u32>,
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids (at least one).
    pub prompt_ids: Vec<u32>,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// Stop tokens and eos handling.
    pub stop: StopParams,
    /// Generated tokens at most; `None` fills the context up to the top bucket.
    pub max_tokens: Option<usize>,
    /// How many top log-probabilities to return per token (`Some(0)`: the chosen one only).
    pub logprobs: Option<usize>,
    /// Do not stop on the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// The longer-lived sequence this request continues or starts, if any.
    pub sequence: Option<SequenceControl>,
    /// Which tokens may come next (a grammar or schema); `None` leaves the model free.
    pub constraint: Option<Constraint>,
}

/// Names a sequence that outlives one request: a conversation whose later turns reuse the K/V
/// of the earlier ones, or a Triton sequence (START ... END).
pub type SequenceKey = u64;

/// How a request joins a longer-lived sequence.
///
/// A sequence parked under `key` is continued: its tokens (prompt and output of the requests
/// before, their K/V still in the pools unless evicted) come first, this request's prompt after
/// them, and only the new tokens are prefilled. With no sequence parked under `key`, the
/// request starts one. When the request finishes by a stop or its budget, the sequence is
/// parked under `key` if `park` is set (its pages kept for the next request; freed first,
/// oldest first, when running sequences need pages, and then recomputed on resume), or ended
/// otherwise. An aborted request ends its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceControl {
    /// The sequence.
    pub key: SequenceKey,
    /// Keep the sequence for a later request when this one finishes.
    pub park: bool,
}

impl GenerateRequest {
    /// Greedy decoding of `prompt_ids` for at most `max_tokens` tokens.
    pub fn greedy(prompt_ids: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt_ids,
            sampling: SamplingParams::greedy(),
            stop: StopParams::default(),
            max_tokens: Some(max_tokens),
            logprobs: None,
            ignore_eos: false,
            sequence: None,
            constraint: None,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A stop or end-of-sequence token was emitted.
    Stop,
    /// The token budget was used up.
    Length,
    /// The request was aborted (by the caller, or its listener went away).
    Abort,
}

impl FinishReason {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt as submitted.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

/// Where a request's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTimings {
    /// Submission until its first step.
    pub queued: Duration,
    /// Submission until its first generated token.
    pub time_to_first_token: Option<Duration>,
    /// Submission until it finished.
    pub total: Duration,
    /// Times it was preempted and recomputed.
    pub preemptions: u32,
}

/// A sequence that ended, with its accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Time split.
    pub timings: RequestTimings,
}

/// What a step produced for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenUpdate {
    /// The request.
    pub id: RequestId,
    /// The new token (with log-probabilities when asked).
    pub sampled: Sampled,
    /// Set when this token ended the request (its pages are already free).
    pub finish: Option<Finish>,
}

/// A request refused at submission, named.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// An empty prompt.
    #[error("empty prompt refused; a prompt needs at least 1 token")]
    EmptyPrompt,
    /// A prompt token outside the vocabulary.
    #[error(
        "prompt token id {token} at index {index} refused: the vocabulary has ids 0..{vocab_size}"
    )]
    TokenOutOfVocabulary {
        token: u32,
        index: usize,
        vocab_size: usize,
    },
    /// `max_tokens` of 0.
    #[error("max_tokens 0 refused; ask for at least 1 token")]
    ZeroMaxTokens,
    /// Prompt plus budget past the top context bucket (never clamped).
    #[error(
        "prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} needs a context of {needed} tokens, past the artifact's top context bucket of {max_context}; shorten the prompt or lower max_tokens"
    )]
    ContextTooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        needed: usize,
        max_context: usize,
    },
    /// The sequence would need more pages than the pool holds in all.
    #[error(
        "a context of {needed} tokens needs {pages} K/V pages but the pool has only {allocatable}; export with more blocks or lower max_tokens"
    )]
    PoolTooSmall {
        needed: usize,
        pages: usize,
        allocatable: usize,
    },
    /// A sampling parameter out of range.
    #[error(transparent)]
    Sampling(#[from] crate::sampling::InvalidSamplingParam),
    /// A request for a sequence that another request is still running.
    #[error(
        "sequence {key} refused: a request for it is still running; send the next request after that one finishes"
    )]
    SequenceBusy { key: SequenceKey },
    /// A `logit_bias` token outside the vocabulary.
    #[error("logit_bias token id {token} refused: the vocabulary has ids 0..{vocab_size}")]
    BiasTokenOutOfVocabulary { token: u32, vocab_size: usize },
    /// `logprobs` past the vocabulary.
    #[error("logprobs {asked} refused: at most {vocab_size} (the vocabulary size)")]
    TooManyLogprobs { asked: usize, vocab_size: usize },
}

/// A request that passed [`GenerateRequest::validate`] against one model's shape, with its
/// token budget resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedRequest {
    request: GenerateRequest,
    max_tokens: usize,
}

impl ValidatedRequest {
    /// The request as submitted.
    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// Its token budget: `max_tokens`, or what the top context bucket leaves after the prompt.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The request and its budget.
    pub fn into_parts(self) -> (GenerateRequest, usize) {
        (self.request, self.max_tokens)
    }
}

impl GenerateRequest {
    /// Checks the request against the ladder, the pool and the vocabulary of `shape`.
    pub fn validate(self, shape: &ModelShape) -> Result<ValidatedRequest, Refusal> {
        let max_tokens = self.check(shape)?;
        Ok(ValidatedRequest {
            request: self,
            max_tokens,
        })
    }

    fn check(&self, shape: &ModelShape) -> Result<usize, Refusal> {
        let vocab_size = shape.vocab_size;
        let request = self;
        let prompt = &request.prompt_ids;
        if prompt.is_empty() {
            return Err(Refusal::EmptyPrompt);
        }
        if let Some((index, &token)) = prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab_size)
        {
            return Err(Refusal::TokenOutOfVocabulary {
                token,
                index,
                vocab_size,
            });
        }
        request.sampling.validate()?;
        if let Some(&(token, _)) = request
            .sampling
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= vocab_size)
        {
            return Err(Refusal::BiasTokenOutOfVocabulary { token, vocab_size });
        }
        if let Some(asked) = request.logprobs
            && asked > vocab_size
        {
            return Err(Refusal::TooManyLogprobs { asked, vocab_size });
        }
        self.budget_after(0, shape)
    }

    /// The token budget of this request when `history` tokens of its sequence come before its
    /// prompt (0 for a new sequence): `max_tokens`, or what the top context bucket leaves;
    /// refused when the whole does not fit the top context bucket or the pool.
    pub(crate) fn budget_after(
        &self,
        history: usize,
        shape: &ModelShape,
    ) -> Result<usize, Refusal> {
        let context = history.saturating_add(self.prompt_ids.len());
        let max_context = shape.ladder.max_context();
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(Refusal::ZeroMaxTokens),
            Some(n) => n,
            None => max_context.saturating_sub(context).max(1),
        };
        let needed = context.saturating_add(max_tokens);
        if needed > max_context {
            return Err(Refusal::ContextTooLong {
                prompt_tokens: context,
                max_tokens,
                needed,
                max_context,
            });
        }
        let pages = needed.div_ceil(shape.block_size);
        let allocatable = shape.allocatable_pages();
        if pages > allocatable {
            return Err(Refusal::PoolTooSmall {
                needed,
                pages,
                allocatable,
            });
        }
        Ok(max_tokens)
    }
}
