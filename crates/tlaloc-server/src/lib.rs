//! OpenAI-compatible HTTP server over the runtime engine: `/v1/completions`,
//! `/v1/chat/completions` (with SSE streaming, structured outputs and tool calling),
//! `/v1/responses` (stateless), `/v1/models`, `/tokenize`, `/detokenize`,
//! `/health`, `/ready`, `/metrics`, and its own OpenAPI description at `/openapi.json`
//! ([`openapi()`], committed as `docs/openapi.json`).
//!
//! The server listens before the model is loaded (`/ready` answers 503 until it is), bounds the
//! sequences it holds (429 past the queue), the time a client may take to send a request's
//! headers and body, and the size of a body; aborts the sequences of a client that went away;
//! and on SIGTERM or ctrl-c stops accepting, closes idle and half-sent connections, finishes
//! what is in flight (within a bound), and stops the engine. [`connection`] owns the sockets.

#![forbid(unsafe_code)]

pub mod body;
pub mod chat;
pub mod connection;
pub mod error;
pub mod generate;
pub mod metrics;
pub mod openapi;
pub mod render;
pub mod request;
pub mod response;
pub mod responses;
pub mod routes;
pub mod state;
pub mod structured;
pub mod text;
pub mod tools;
pub mod validate;

use std::future::Future;

use thiserror::Error;
use tlaloc_runtime::EngineHandle;
use tokio::net::TcpListener;

pub use error::ApiError;
pub use openapi::{openapi, openapi_json};
pub use routes::router;
pub use state::{AppState, ModelText, ModelTextError, ServerConfig, SharedState};

use crate::connection::{ConnectionTimeouts, serve_connections};

/// The server could not run.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The model did not load.
    #[error("the model failed to load: {0}")]
    Load(String),
    /// The listener failed.
    #[error("the HTTP listener failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves `state` on `listener`: loads the engine with `load` on a blocking thread meanwhile,
/// and returns once `shutdown` resolves and the connections have drained (see
/// [`connection::serve_connections`]), or, with an error, once loading has failed and they have
/// drained.
pub async fn serve<L, S>(
    listener: TcpListener,
    state: SharedState,
    load: L,
    shutdown: S,
) -> Result<(), ServeError>
where
    L: FnOnce() -> Result<EngineHandle, String> + Send + 'static,
    S: Future<Output = ()> + Send + 'static,
{
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let loading_state = state.clone();
    tokio::spawn(async move {
        match tokio::task::spawn_blocking(load).await {
            Ok(Ok(engine)) => {
                loading_state.set_engine(engine);
                tracing::info!("model loaded; ready");
            }
            Ok(Err(e)) => {
                let _ = failed_tx.send(e);
            }
            Err(e) => {
                let _ = failed_tx.send(format!("the loading thread failed: {e}"));
            }
        }
    });
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let stopping_state = state.clone();
    let stop = tokio::spawn(async move {
        let failure = tokio::select! {
            () = shutdown => None,
            Ok(e) = failed_rx => Some(e),
        };
        stopping_state.set_stopping();
        tracing::info!("stopping: no new connections; finishing requests in flight");
        let _ = stopping_tx.send(true);
        failure
    });
    let config = &state.config;
    let timeouts = ConnectionTimeouts {
        header_read: config.header_read_timeout,
        shutdown: config.shutdown_timeout,
    };
    serve_connections(listener, router(state.clone()), timeouts, stopping_rx).await;
    if let Some(engine) = state.engine().cloned() {
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    }
    match stop.await {
        Ok(Some(failure)) => Err(ServeError::Load(failure)),
        _ => Ok(()),
    }
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Binds `host:port` and runs [`serve`] on a runtime of its own until ctrl-c or SIGTERM (for
/// callers without an async runtime, such as the CLI).
pub fn run_blocking<L>(host: &str, port: u16, state: SharedState, load: L) -> Result<(), ServeError>
where
    L: FnOnce() -> Result<EngineHandle, String> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tlaloc-http")
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind((host, port)).await?;
        tracing::info!(address = %listener.local_addr()?, "listening");
        serve(listener, state, load, shutdown_signal()).await
    })
}
