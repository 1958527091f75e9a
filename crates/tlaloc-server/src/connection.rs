//! The accept loop and the life of each connection: the HTTP/1 connection that hyper runs, with
//! a header read timeout; a lingering close after a response that left its request body unread;
//! and the drain on shutdown, which lets requests in flight finish, closes idle and half-sent
//! connections at once, and is bounded as a whole.
//!
//! The loop is written here on hyper's HTTP/1 connection rather than through `axum::serve`,
//! which takes no configuration: it sets no timer, so hyper's header read timeout never runs; its
//! protocol sniffing (HTTP/1 or HTTP/2) sits outside hyper's graceful shutdown, so a connection
//! that has sent part of a request holds the drain open; and it never gives the socket back, so
//! an early refusal ends in a reset. hyper's `http1::Connection` gives all three:
//! `header_read_timeout` with a Tokio timer, `graceful_shutdown` per connection, and
//! `poll_without_shutdown` with `into_parts`, which hand the socket back once hyper is done with
//! it. Only HTTP/1 is served, as before (the router is built with axum's `http1` feature only).
//!
//! Why linger: a server that answers before reading a body (a 413 for a declared oversize body,
//! a 408 for a stalled one) and then closes the socket with unread bytes in its receive buffer
//! makes the kernel send a reset, and a client still writing its body (Python's `urllib`, a raw
//! socket) gets a broken pipe and never reads the answer. So the write side is shut down first
//! (the client sees the answer and the end of the stream), and what the client still sends is
//! read and thrown away until it closes, within [`LINGER_TIME`] and [`LINGER_BYTES`].

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The longest a lingering close reads what a client still sends after its answer.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// The most bytes a lingering close reads and throws away.
pub const LINGER_BYTES: u64 = 256 << 20;

/// The timeouts each connection runs under.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionTimeouts {
    /// See [`crate::ServerConfig::header_read_timeout`].
    pub header_read: Duration,
    /// See [`crate::ServerConfig::shutdown_timeout`].
    pub shutdown: Duration,
}

/// Accepts connections on `listener` and serves `router` on each until `stopping` turns true;
/// then closes the listener, drains the connections (see the module doc) and returns once
/// every one has closed, or once [`ConnectionTimeouts::shutdown`] has passed, closing those
/// still open.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    timeouts: ConnectionTimeouts,
    mut stopping: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let for_connections = stopping.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(
                        stream,
                        router.clone(),
                        timeouts,
                        for_connections.clone(),
                    ));
                }
                Err(e) => pause_after_accept_error(e).await,
            },
            // Reaps finished connections, so that the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stopped(&mut stopping) => break,
        }
    }
    drop(listener);
    let open = connections.len();
    tracing::info!(open, "listener closed; draining connections");
    let drained = tokio::time::timeout(timeouts.shutdown, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            still_open = connections.len(),
            bound_s = timeouts.shutdown.as_secs_f64(),
            "the drain reached its bound; closing the connections still open"
        );
        connections.shutdown().await;
    }
}

/// Resolves once `stopping` is true (or its sender is gone, which only happens after).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns must not be held across an await.
    let _ = stopping.wait_for(|s| *s).await;
}

/// An accept error on one connection (the client went before it was accepted) needs nothing;
/// any other (out of file descriptors) is logged and waited out briefly, not spun on.
async fn pause_after_accept_error(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        tracing::error!("accept failed: {e}; retrying in 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What the service tells the connection loop about the requests on one connection.
#[derive(Debug, Default)]
struct ConnectionActivity {
    /// Requests whose response has not been sent to its end.
    in_flight: AtomicUsize,
    /// Whether the latest request's body was left unread.
    body_unread: AtomicBool,
}

/// One request in flight on its connection, until its response body is done.
#[derive(Debug)]
struct InFlight(Arc<ConnectionActivity>);

impl InFlight {
    fn begin(activity: &Arc<ConnectionActivity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves one connection until it closes, the drain closes it, or the client breaks off.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    timeouts: ConnectionTimeouts,
    mut stopping: watch::Receiver<bool>,
) {
    let activity = Arc::new(ConnectionActivity::default());
    let service = ConnectionService {
        router,
        activity: Arc::clone(&activity),
    };
    let mut connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .serve_connection(TokioIo::new(stream), service);
    let mut draining = false;
    let served = loop {
        tokio::select! {
            served = poll_fn(|cx| connection.poll_without_shutdown(cx)) => break served,
            () = stopped(&mut stopping), if !draining => {}
        }
        if activity.in_flight.load(Ordering::Acquire) == 0 {
            // Idle, or in the middle of a request's headers: nothing to finish.
            return;
        }
        // Finish the response in flight, then close.
        Pin::new(&mut connection).graceful_shutdown();
        draining = true;
    };
    match served {
        Ok(()) if activity.body_unread.load(Ordering::Acquire) => {
            linger_close(connection.into_parts().io.into_inner()).await;
        }
        Ok(()) => {}
        // A header read timeout, a reset or a broken request: nothing more can be said to it.
        Err(e) => tracing::debug!("connection closed: {e}"),
    }
}

/// Shuts the write side, then reads and discards until the client closes, within
/// [`LINGER_TIME`] and [`LINGER_BYTES`] (see the module doc).
async fn linger_close(mut stream: TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER_TIME;
    let mut discarded = 0u64;
    let mut buffer = vec![0u8; 64 << 10];
    while discarded < LINGER_BYTES {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => discarded += n as u64,
        }
    }
}

/// The router as hyper calls it on one connection: requests are counted in flight until their
/// response body is done, and a request body left unread is noted for the close.
#[derive(Debug, Clone)]
struct ConnectionService {
    router: Router,
    activity: Arc<ConnectionActivity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = hyper::Response<TrackedResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::begin(&self.activity);
        let activity = Arc::clone(&self.activity);
        activity.body_unread.store(
            !http_body::Body::is_end_stream(request.body()),
            Ordering::Release,
        );
        let request: Request =
            request.map(|inner| Body::new(TrackedRequestBody { inner, activity }));
        let mut router = self.router.clone();
        Box::pin(async move {
            let response: Response = match tower_service::Service::call(&mut router, request).await
            {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(response.map(|inner| TrackedResponseBody {
                inner,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A request body that notes on its connection when it has been read to its end.
#[derive(Debug)]
struct TrackedRequestBody {
    inner: Incoming,
    activity: Arc<ConnectionActivity>,
}

impl http_body::Body for TrackedRequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.activity.body_unread.store(false, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that holds its request's place in flight until it is done or dropped.
#[derive(Debug)]
struct TrackedResponseBody {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
