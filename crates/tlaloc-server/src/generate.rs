//! One request's generation: its `n` engine sequences, their merged token streams, incremental
//! detokenization and stop strings per choice, and the guard that aborts every sequence still
//! running when the request is dropped (a client that went away drops the handler's future or
//! the response stream, and with it this guard).

use std::time::Instant;

use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use tlaloc_runtime::{EngineHandle, RequestId, TokenEvent};
use tracing::Span;

use crate::error::ApiError;
use crate::response::FinishReason;
use crate::state::{Admission, SharedState, unix_now};
use crate::text::{IncrementalDecoder, StopMatcher};
use crate::validate::ValidatedGeneration;

/// One token's log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives.
    pub top: Vec<(u32, f32)>,
}

/// What one event of one choice produced.
#[derive(Debug, Clone, Default)]
pub struct Piece {
    /// The choice.
    pub index: usize,
    /// Text now safe to send (may be empty).
    pub text: String,
    /// Log-probabilities of the tokens this piece consumed (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Set on the choice's last piece.
    pub finish: Option<FinishReason>,
}

/// How one choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceEnd {
    /// It finished, for this reason.
    Finished(FinishReason),
    /// The engine failed it (the request answers with an error).
    Failed,
}

impl ChoiceEnd {
    /// The metrics label: the finish reason, or `error`.
    pub fn label(self) -> &'static str {
        match self {
            ChoiceEnd::Finished(reason) => reason.as_str(),
            ChoiceEnd::Failed => "error",
        }
    }
}

#[derive(Debug)]
struct Choice {
    engine_id: RequestId,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    tokens: usize,
    last_token_at: Option<Instant>,
    end: Option<ChoiceEnd>,
}

/// Aborts every sequence of a request still in the engine when dropped.
#[derive(Debug)]
struct AbortGuard {
    engine: EngineHandle,
    ids: Vec<RequestId>,
    finished: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.finished {
            for &id in &self.ids {
                self.engine.abort(id);
            }
        }
    }
}

/// A running request.
pub struct Generation {
    state: SharedState,
    choices: Vec<Choice>,
    events: SelectAll<BoxStream<'static, (usize, TokenEvent)>>,
    guard: AbortGuard,
    _admission: Admission,
    started: Instant,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Whether log-probabilities were asked for.
    pub wants_logprobs: bool,
    /// The response id (also the request id in logs).
    pub id: String,
    /// Unix seconds when the request was accepted: the `created` of its response, or of every
    /// chunk of its stream.
    pub created: u64,
    span: Span,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.id)
            .field("choices", &self.choices)
            .finish_non_exhaustive()
    }
}

impl Generation {
    /// Admits and submits `validated.n` sequences; an engine refusal names the field of the
    /// request that caused it.
    pub fn start(
        state: &SharedState,
        engine: &EngineHandle,
        validated: &ValidatedGeneration,
        id: String,
    ) -> Result<Self, ApiError> {
        let admission = state.admit(engine, validated.n)?;
        let span = tracing::info_span!("request", id = %id);
        let mut guard = AbortGuard {
            engine: engine.clone(),
            ids: Vec::new(),
            finished: false,
        };
        let mut choices = Vec::new();
        let mut events = SelectAll::new();
        for index in 0..validated.n {
            let mut request = validated.request.clone();
            if let Some(seed) = request.sampling.seed.as_mut() {
                *seed = seed.wrapping_add(index as u64);
            }
            request.constraint = validated.grammar.as_ref().map(|g| g.constraint());
            let (engine_id, mut rx) = engine
                .submit(request)
                .map_err(|e| validated.fields.api_error(e))?;
            guard.ids.push(engine_id);
            choices.push(Choice {
                engine_id,
                decoder: IncrementalDecoder::default(),
                stop: StopMatcher::new(validated.stop.clone()),
                tokens: 0,
                last_token_at: None,
                end: None,
            });
            events.push(
                stream::poll_fn(move |cx| rx.poll_recv(cx))
                    .map(move |e| (index, e))
                    .boxed(),
            );
        }
        let prompt_tokens = validated.request.prompt_ids.len();
        span.in_scope(|| {
            tracing::info!(
                prompt_tokens,
                n = validated.n,
                max_tokens = ?validated.request.max_tokens,
                stream = validated.stream,
                engine_ids = ?guard.ids,
                "accepted"
            )
        });
        Ok(Generation {
            state: state.clone(),
            choices,
            events,
            guard,
            _admission: admission,
            started: Instant::now(),
            prompt_tokens,
            wants_logprobs: validated.request.logprobs.is_some(),
            id,
            created: unix_now(),
            span,
        })
    }

    /// Tokens generated so far, all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.tokens).sum()
    }

    /// The next piece, `None` when every choice has finished.
    pub async fn next_piece(&mut self) -> Option<Result<Piece, ApiError>> {
        loop {
            if self.choices.iter().all(|c| c.end.is_some()) {
                if !self.guard.finished {
                    self.guard.finished = true;
                    self.log_finished();
                }
                return None;
            }
            let Some((index, event)) = self.events.next().await else {
                return Some(Err(ApiError::internal(
                    "the engine stopped before the request finished",
                )));
            };
            if let Some(piece) = self.apply(index, event) {
                return Some(piece);
            }
        }
    }

    fn apply(&mut self, index: usize, event: TokenEvent) -> Option<Result<Piece, ApiError>> {
        let state = &self.state;
        let codec = &state.text.codec;
        let choice = &mut self.choices[index];
        if choice.end.is_some() {
            return None;
        }
        let mut piece = Piece {
            index,
            ..Piece::default()
        };
        match event {
            TokenEvent::Token {
                id,
                logprob,
                top_logprobs,
            } => {
                let now = Instant::now();
                match choice.last_token_at {
                    None => state.metrics.observe_ttft(now - self.started),
                    Some(t) => state.metrics.observe_itl(now - t),
                }
                choice.last_token_at = Some(now);
                choice.tokens += 1;
                if let Some(logprob) = logprob {
                    piece.logprobs.push(TokenLogprob {
                        id,
                        logprob,
                        top: top_logprobs,
                    });
                }
                let text = match choice.decoder.push(codec, id) {
                    Ok(t) => t,
                    Err(e) => return Some(Err(ApiError::internal(e.to_string()))),
                };
                let matched = choice.stop.push(&text);
                piece.text = matched.text;
                if matched.stopped {
                    self.guard.engine.abort(choice.engine_id);
                    self.end_choice(index, ChoiceEnd::Finished(FinishReason::Stop));
                    piece.finish = Some(FinishReason::Stop);
                }
            }
            TokenEvent::Finished { reason, .. } => {
                let rest = match choice.decoder.flush(codec) {
                    Ok(t) => t,
                    Err(e) => return Some(Err(ApiError::internal(e.to_string()))),
                };
                let matched = choice.stop.push(&rest);
                piece.text = matched.text;
                if !matched.stopped {
                    piece.text.push_str(&choice.stop.finish());
                }
                // A stop string found in the held-back text ends the choice as a stop, whatever
                // ended the sequence.
                let reason = if matched.stopped {
                    FinishReason::Stop
                } else {
                    FinishReason::from(reason)
                };
                self.end_choice(index, ChoiceEnd::Finished(reason));
                piece.finish = Some(reason);
            }
            TokenEvent::Error { message } => {
                self.end_choice(index, ChoiceEnd::Failed);
                return Some(Err(ApiError::internal(message)));
            }
        }
        Some(Ok(piece))
    }

    fn end_choice(&mut self, index: usize, end: ChoiceEnd) {
        self.choices[index].end = Some(end);
        self.state
            .metrics
            .observe_finished(end, self.started.elapsed());
    }

    fn log_finished(&self) {
        let reasons: Vec<&str> = self
            .choices
            .iter()
            .filter_map(|c| c.end.map(ChoiceEnd::label))
            .collect();
        self.span.in_scope(|| {
            tracing::info!(
                completion_tokens = self.completion_tokens(),
                finish = ?reasons,
                elapsed_ms = self.started.elapsed().as_millis() as u64,
                "finished"
            )
        });
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.guard.finished {
            let unfinished = self.choices.iter().filter(|c| c.end.is_none()).count();
            for _ in 0..unfinished {
                self.state.metrics.observe_finished(
                    ChoiceEnd::Finished(FinishReason::Abort),
                    self.started.elapsed(),
                );
            }
            self.span.in_scope(|| {
                tracing::info!(
                    completion_tokens = self.completion_tokens(),
                    "client gone before the end; aborting its sequences"
                )
            });
        }
    }
}
