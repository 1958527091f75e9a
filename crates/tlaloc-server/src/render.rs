//! A running [`Generation`] turned into its endpoint's typed bodies: one JSON response once
//! every choice has finished, or server-sent chunks as pieces arrive. What differs between
//! `/v1/completions` and `/v1/chat/completions` (body types, the log-probability shape, the
//! role chunk a chat stream opens with) is one [`Endpoint`] impl each; the collecting and
//! streaming are written once.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::Duration;

use axum::Json;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde::Serialize;

use crate::error::ApiError;
use crate::generate::{Generation, Piece, TokenLogprob};
use crate::response::{
    AssistantMessage, AssistantRole, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatTokenLogprob, ChatTopLogprob,
    CompletionChoice, CompletionChunk, CompletionChunkChoice, CompletionLogprobs,
    CompletionResponse, FinishReason, ToolCall, ToolCallDelta, Usage, json_event,
};
use crate::state::{AppState, SharedState};
use crate::tools::{self, ToolStream};
use crate::validate::ValidatedGeneration;

/// What every body of one response repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyHead {
    /// The response id.
    pub id: String,
    /// Unix seconds when the response was created (the same in every chunk of a stream).
    pub created: u64,
    /// The served model name.
    pub model: String,
}

/// One choice, finished.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedChoice<L> {
    /// Its index.
    pub index: usize,
    /// All its text.
    pub text: String,
    /// Log-probabilities of all its tokens, when asked for.
    pub logprobs: Option<L>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// The tool calls its text was read as (chat only; then `text` is what was not calls).
    pub tool_calls: Vec<ToolCall>,
}

/// One piece of one choice, as a chunk carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoicePiece<L> {
    /// The choice's index.
    pub index: usize,
    /// Text that follows the choice's earlier pieces.
    pub text: String,
    /// Log-probabilities of the piece's tokens, when asked for.
    pub logprobs: Option<L>,
    /// Set on the choice's last piece.
    pub finish_reason: Option<FinishReason>,
    /// Tool-call pieces (chat only).
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A generation endpoint's bodies.
pub trait Endpoint: Send + 'static {
    /// Log-probabilities of a run of tokens.
    type Logprobs: Serialize + Send;
    /// The whole answer.
    type Response: Serialize;
    /// One streamed chunk.
    type Chunk: Serialize;

    /// The prefix of the endpoint's response ids.
    const ID_PREFIX: &'static str;

    /// Log-probabilities of `tokens`, whose text starts at byte `text_offset` of the choice's.
    fn logprobs(state: &AppState, tokens: &[TokenLogprob], text_offset: usize) -> Self::Logprobs;

    /// The answer once every choice has finished.
    fn response(
        head: BodyHead,
        choices: Vec<FinishedChoice<Self::Logprobs>>,
        usage: Usage,
    ) -> Self::Response;

    /// A chunk carrying one choice's piece.
    fn piece_chunk(head: BodyHead, piece: ChoicePiece<Self::Logprobs>) -> Self::Chunk;

    /// The last chunk before `[DONE]`, when usage was asked for: no choices, the counts.
    fn usage_chunk(head: BodyHead, usage: Usage) -> Self::Chunk;

    /// Chunks a stream opens with, before any token.
    fn opening_chunks(_head: &BodyHead, _n: usize) -> Vec<Self::Chunk> {
        Vec::new()
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Copy)]
pub struct Completions;

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Copy)]
pub struct ChatCompletions;

fn token_text(state: &AppState, id: u32) -> String {
    state.text.codec.decode(&[id], false).unwrap_or_default()
}

impl Endpoint for Completions {
    type Logprobs = CompletionLogprobs;
    type Response = CompletionResponse;
    type Chunk = CompletionChunk;

    const ID_PREFIX: &'static str = "cmpl";

    fn logprobs(state: &AppState, tokens: &[TokenLogprob], text_offset: usize) -> Self::Logprobs {
        let texts: Vec<String> = tokens.iter().map(|l| token_text(state, l.id)).collect();
        let mut text_offsets = Vec::with_capacity(texts.len());
        let mut at = text_offset;
        for t in &texts {
            text_offsets.push(at);
            at += t.len();
        }
        CompletionLogprobs {
            token_logprobs: tokens.iter().map(|l| f64::from(l.logprob)).collect(),
            top_logprobs: tokens
                .iter()
                .map(|l| {
                    l.top
                        .iter()
                        .map(|&(id, lp)| (token_text(state, id), f64::from(lp)))
                        .collect::<BTreeMap<_, _>>()
                })
                .collect(),
            tokens: texts,
            text_offset: text_offsets,
        }
    }

    fn response(
        head: BodyHead,
        choices: Vec<FinishedChoice<Self::Logprobs>>,
        usage: Usage,
    ) -> Self::Response {
        CompletionResponse {
            id: head.id,
            object: Default::default(),
            created: head.created,
            model: head.model,
            choices: choices
                .into_iter()
                .map(|c| CompletionChoice {
                    index: c.index,
                    text: c.text,
                    logprobs: c.logprobs,
                    finish_reason: c.finish_reason,
                })
                .collect(),
            usage,
        }
    }

    fn piece_chunk(head: BodyHead, piece: ChoicePiece<Self::Logprobs>) -> Self::Chunk {
        let choice = CompletionChunkChoice {
            index: piece.index,
            text: piece.text,
            logprobs: piece.logprobs,
            finish_reason: piece.finish_reason,
        };
        completion_chunk(head, vec![choice], None)
    }

    fn usage_chunk(head: BodyHead, usage: Usage) -> Self::Chunk {
        completion_chunk(head, Vec::new(), Some(usage))
    }
}

fn completion_chunk(
    head: BodyHead,
    choices: Vec<CompletionChunkChoice>,
    usage: Option<Usage>,
) -> CompletionChunk {
    CompletionChunk {
        id: head.id,
        object: Default::default(),
        created: head.created,
        model: head.model,
        choices,
        usage,
    }
}

impl Endpoint for ChatCompletions {
    type Logprobs = ChatLogprobs;
    type Response = ChatCompletionResponse;
    type Chunk = ChatCompletionChunk;

    const ID_PREFIX: &'static str = "chatcmpl";

    fn logprobs(state: &AppState, tokens: &[TokenLogprob], _text_offset: usize) -> Self::Logprobs {
        let top = |id: u32, logprob: f32| {
            let token = token_text(state, id);
            ChatTopLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: f64::from(logprob),
            }
        };
        ChatLogprobs {
            content: tokens
                .iter()
                .map(|l| {
                    let chosen = top(l.id, l.logprob);
                    ChatTokenLogprob {
                        token: chosen.token,
                        logprob: chosen.logprob,
                        bytes: chosen.bytes,
                        top_logprobs: l.top.iter().map(|&(id, lp)| top(id, lp)).collect(),
                    }
                })
                .collect(),
        }
    }

    fn response(
        head: BodyHead,
        choices: Vec<FinishedChoice<Self::Logprobs>>,
        usage: Usage,
    ) -> Self::Response {
        ChatCompletionResponse {
            id: head.id,
            object: Default::default(),
            created: head.created,
            model: head.model,
            choices: choices
                .into_iter()
                .map(|c| ChatChoice {
                    index: c.index,
                    message: AssistantMessage {
                        role: AssistantRole::Assistant,
                        content: (c.tool_calls.is_empty() || !c.text.is_empty()).then_some(c.text),
                        tool_calls: c.tool_calls,
                    },
                    logprobs: c.logprobs,
                    finish_reason: c.finish_reason,
                })
                .collect(),
            usage,
        }
    }

    fn piece_chunk(head: BodyHead, piece: ChoicePiece<Self::Logprobs>) -> Self::Chunk {
        let choice = ChatChunkChoice {
            index: piece.index,
            delta: ChatDelta {
                role: None,
                content: (!piece.text.is_empty()).then_some(piece.text),
                tool_calls: (!piece.tool_calls.is_empty()).then_some(piece.tool_calls),
            },
            logprobs: piece.logprobs,
            finish_reason: piece.finish_reason,
        };
        chat_chunk(head, vec![choice], None)
    }

    fn usage_chunk(head: BodyHead, usage: Usage) -> Self::Chunk {
        chat_chunk(head, Vec::new(), Some(usage))
    }

    /// Each choice's message opens with the assistant's role and empty content, as OpenAI's
    /// streams do (clients read the role from the first delta).
    fn opening_chunks(head: &BodyHead, n: usize) -> Vec<Self::Chunk> {
        (0..n)
            .map(|index| {
                let choice = ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some(AssistantRole::Assistant),
                        content: Some(String::new()),
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                };
                chat_chunk(head.clone(), vec![choice], None)
            })
            .collect()
    }
}

fn chat_chunk(
    head: BodyHead,
    choices: Vec<ChatChunkChoice>,
    usage: Option<Usage>,
) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: head.id,
        object: Default::default(),
        created: head.created,
        model: head.model,
        choices,
        usage,
    }
}

fn head(state: &AppState, generation: &Generation) -> BodyHead {
    BodyHead {
        id: generation.id.clone(),
        created: generation.created,
        model: state.config.served_model_name.clone(),
    }
}

/// Answers with `generation`: as an event stream when the request asked to stream, else as one
/// JSON body once every choice has finished.
pub async fn respond<E: Endpoint>(
    state: SharedState,
    mut generation: Generation,
    validated: &ValidatedGeneration,
) -> Result<Response, ApiError> {
    let n = validated.n;
    if validated.stream {
        let stream = sse_stream::<E>(state, generation, validated);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
            .into_response());
    }
    let mut texts = vec![String::new(); n];
    let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut finishes = vec![FinishReason::Abort; n];
    while let Some(piece) = generation.next_piece().await {
        let piece = piece?;
        texts[piece.index].push_str(&piece.text);
        logprobs[piece.index].extend(piece.logprobs);
        if let Some(f) = piece.finish {
            finishes[piece.index] = f;
        }
    }
    let choices = texts
        .into_iter()
        .zip(logprobs)
        .zip(finishes)
        .enumerate()
        .map(|(index, ((text, tokens), finish_reason))| {
            let (text, tool_calls, finish_reason) = match &validated.tools {
                None => (text, Vec::new(), finish_reason),
                Some(reply) => {
                    let reading = tools::read_reply(reply, &text, || call_id(&state));
                    let finish = tool_finish(finish_reason, !reading.calls.is_empty());
                    (reading.content.unwrap_or_default(), reading.calls, finish)
                }
            };
            FinishedChoice {
                index,
                text,
                logprobs: generation
                    .wants_logprobs
                    .then(|| E::logprobs(&state, &tokens, 0)),
                finish_reason,
                tool_calls,
            }
        })
        .collect();
    let usage = Usage::new(generation.prompt_tokens, generation.completion_tokens());
    let body = E::response(head(&state, &generation), choices, usage);
    Ok(Json(body).into_response())
}

/// A new tool-call id.
fn call_id(state: &AppState) -> String {
    tools::next_call_id(state.started_at, state.config.tool_call_parser)
}

/// A choice that made calls ends `tool_calls` where it would have ended `stop`.
fn tool_finish(reason: FinishReason, called: bool) -> FinishReason {
    if called && reason == FinishReason::Stop {
        FinishReason::ToolCalls
    } else {
        reason
    }
}

struct Streamer<E> {
    state: SharedState,
    generation: Generation,
    include_usage: bool,
    /// Each choice's tool-call reader, when the reply is read for calls.
    tool_streams: Option<Vec<ToolStream>>,
    queue: VecDeque<Event>,
    text_offsets: Vec<usize>,
    done: bool,
    endpoint: PhantomData<E>,
}

impl<E: Endpoint> Streamer<E> {
    fn piece_chunk(&mut self, mut piece: Piece) -> Option<Event> {
        let i = piece.index;
        let mut tool_calls = Vec::new();
        if let Some(streams) = self.tool_streams.as_mut() {
            let state = &self.state;
            let mut read = streams[i].push(&piece.text, || call_id(state));
            if let Some(reason) = piece.finish {
                let (rest, called) = streams[i].finish(|| call_id(state));
                read.content.push_str(&rest.content);
                read.calls.extend(rest.calls);
                piece.finish = Some(tool_finish(reason, called));
            }
            piece.text = read.content;
            tool_calls = read.calls;
        }
        if piece.text.is_empty()
            && piece.logprobs.is_empty()
            && piece.finish.is_none()
            && tool_calls.is_empty()
        {
            return None;
        }
        let logprobs = self
            .generation
            .wants_logprobs
            .then(|| E::logprobs(&self.state, &piece.logprobs, self.text_offsets[i]));
        self.text_offsets[i] += piece.text.len();
        let chunk = E::piece_chunk(
            head(&self.state, &self.generation),
            ChoicePiece {
                index: i,
                text: piece.text,
                logprobs,
                finish_reason: piece.finish,
                tool_calls,
            },
        );
        Some(json_event(&chunk))
    }

    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            match self.generation.next_piece().await {
                Some(Ok(piece)) => {
                    if let Some(e) = self.piece_chunk(piece) {
                        return Some(e);
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    self.queue.push_back(e.to_event());
                    self.queue.push_back(Event::default().data("[DONE]"));
                }
                None => {
                    self.done = true;
                    if self.include_usage {
                        let usage = Usage::new(
                            self.generation.prompt_tokens,
                            self.generation.completion_tokens(),
                        );
                        let chunk = E::usage_chunk(head(&self.state, &self.generation), usage);
                        self.queue.push_back(json_event(&chunk));
                    }
                    self.queue.push_back(Event::default().data("[DONE]"));
                }
            }
        }
    }
}

fn sse_stream<E: Endpoint>(
    state: SharedState,
    generation: Generation,
    validated: &ValidatedGeneration,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let n = validated.n;
    let opening = E::opening_chunks(&head(&state, &generation), n);
    let streamer = Streamer::<E> {
        state,
        generation,
        include_usage: validated.include_usage,
        tool_streams: validated
            .tools
            .as_ref()
            .map(|reply| (0..n).map(|_| ToolStream::new(reply.clone())).collect()),
        queue: opening.iter().map(json_event).collect(),
        text_offsets: vec![0; n],
        done: false,
        endpoint: PhantomData,
    };
    stream::unfold(streamer, |mut s| async move {
        let event = s.next_event().await?;
        Some((Ok(event), s))
    })
}
