//! The server on a real socket, spoken to byte by byte: what a client that sends its request
//! slowly, partly, or too large gets, and what shutdown does to the connections it finds. Every
//! wait is bounded by the configured timeouts, scaled; nothing depends on how fast the machine
//! is, except that the scripted engine's step delay is a floor on how long a generation takes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tlaloc_server::{AppState, ServeError, ServerConfig, SharedState, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fake::scripted_engine;

/// `serve` running on a free local port over the scripted engine.
struct Served {
    addr: SocketAddr,
    state: SharedState,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Served {
    async fn start(config: ServerConfig, step_delay: Duration) -> Served {
        let scripted = scripted_engine(&[1, 2, 4], step_delay, None);
        let state = AppState::new(config, scripted.text);
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = oneshot::channel::<()>();
        let engine = scripted.engine;
        let task = tokio::spawn(serve(listener, state.clone(), move || Ok(engine), async {
            let _ = stopped.await;
        }));
        while !state.is_ready() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Served {
            addr,
            state,
            stop: Some(stop),
            task,
        }
    }

    /// What SIGTERM does: starts the shutdown.
    fn terminate(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.expect("connect")
    }
}

/// A response as it came off the wire.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn parse(bytes: &[u8]) -> RawResponse {
        let text = String::from_utf8_lossy(bytes);
        let (head, _) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no complete response head in {text:?}"));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body = bytes[head.len() + 4..].to_vec();
        RawResponse {
            status,
            headers,
            body,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads until the server closes the connection.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .expect("read the response until the server closed");
    bytes
}

/// Waits for the server to close a connection it has sent nothing on (a reset counts as
/// closed too); returns what it did send.
async fn wait_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes).await;
    bytes
}

fn request_head(path: &str, extra_headers: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: tlaloc\r\nContent-Type: application/json\r\n{extra_headers}\r\n"
    )
}

/// Opens a connection and sends a request head one byte every `interval`, forever; returns how
/// long after connecting the server closed it.
async fn trickle_headers(addr: SocketAddr, interval: Duration) -> Duration {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: tlaloc\r\nX-Padding: ";
    let mut sent = 0usize;
    let mut buffer = [0u8; 64];
    loop {
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => panic!("the server answered a request whose head never ended"),
            },
            () = tokio::time::sleep(interval) => {
                let byte = head.get(sent).copied().unwrap_or(b'a');
                if stream.write_all(&[byte]).await.is_err() {
                    return started.elapsed();
                }
                sent += 1;
            }
        }
    }
}

/// Connections that send their headers a byte at a time are closed once the header read
/// timeout has passed, however steadily the bytes come.
#[tokio::test]
async fn slow_headers_are_closed_at_the_header_read_timeout() {
    let mut config = ServerConfig::new("tiny");
    config.header_read_timeout = Duration::from_secs(1);
    let bound = config.header_read_timeout;
    let served = Served::start(config, Duration::ZERO).await;
    let trickles: Vec<_> = (0..50)
        .map(|_| tokio::spawn(trickle_headers(served.addr, bound / 10)))
        .collect();
    for trickle in trickles {
        let closed_after = tokio::time::timeout(bound * 4, trickle)
            .await
            .expect("the server closes a slow head within the header read timeout")
            .expect("the trickling task");
        assert!(
            closed_after >= bound.mul_f64(0.9),
            "closed after {closed_after:?}, before the timeout of {bound:?}"
        );
    }
    // The server still serves everyone else.
    let mut stream = served.connect().await;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: tlaloc\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        RawResponse::parse(&read_to_close(&mut stream).await).status,
        200
    );
}

/// A `Content-Length` over the limit is refused with 413 as soon as the head is in, without
/// waiting for a body the client may never send.
#[tokio::test]
async fn a_declared_oversize_content_length_is_413_at_once() {
    let mut config = ServerConfig::new("tiny");
    config.max_body_bytes = 2000;
    config.body_idle_timeout = Duration::from_secs(20);
    let idle = config.body_idle_timeout;
    let served = Served::start(config, Duration::ZERO).await;
    let mut stream = served.connect().await;
    let head = request_head("/v1/completions", "Content-Length: 99999999999999\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let bytes = tokio::time::timeout(idle / 4, read_to_close(&mut stream))
        .await
        .expect("413 before the body idle timeout, and the connection closed");
    let response = RawResponse::parse(&bytes);
    assert_eq!(response.status, 413, "{response:?}");
    assert_eq!(response.header("connection"), Some("close"));
    let error = &response.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("2000") && message.contains("99999999999999"),
        "{message}"
    );
}

/// A client that writes its whole oversize body before reading (as Python's `urllib` does)
/// reads the 413: the server reads and throws away what it will not use instead of resetting
/// the connection under the client's writes. Both framings: a declared length (refused before
/// the body) and chunks (refused once the limit is passed).
#[tokio::test]
async fn an_oversize_body_sent_whole_is_drained_so_its_client_reads_the_413() {
    const BODY: usize = 64 << 20;
    let mut config = ServerConfig::new("tiny");
    config.max_body_bytes = 2000;
    let served = Served::start(config, Duration::ZERO).await;
    let megabyte = vec![b'x'; 1 << 20];
    for chunked in [false, true] {
        let mut stream = served.connect().await;
        let framing = if chunked {
            "Transfer-Encoding: chunked\r\n".to_owned()
        } else {
            format!("Content-Length: {BODY}\r\n")
        };
        let mut request = request_head("/v1/completions", &framing).into_bytes();
        for _ in 0..BODY / megabyte.len() {
            if chunked {
                request.extend_from_slice(format!("{:x}\r\n", megabyte.len()).as_bytes());
            }
            request.extend_from_slice(&megabyte);
            if chunked {
                request.extend_from_slice(b"\r\n");
            }
        }
        if chunked {
            request.extend_from_slice(b"0\r\n\r\n");
        }
        stream
            .write_all(&request)
            .await
            .unwrap_or_else(|e| panic!("chunked={chunked}: the server reset the upload: {e}"));
        let response = RawResponse::parse(&read_to_close(&mut stream).await);
        assert_eq!(response.status, 413, "chunked={chunked}: {response:?}");
        assert_eq!(response.header("connection"), Some("close"));
        let message = response.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains("2000"), "{message}");
    }
}

/// On shutdown, a connection in the middle of its headers and an idle one are closed at once,
/// while a stream in flight runs to its end; then `serve` returns.
#[tokio::test]
async fn shutdown_closes_half_sent_and_idle_connections_at_once_and_finishes_streams() {
    let mut config = ServerConfig::new("tiny");
    config.header_read_timeout = Duration::from_secs(30);
    config.shutdown_timeout = Duration::from_secs(30);
    let prompt_bound = config.header_read_timeout.min(config.shutdown_timeout) / 4;
    // 100 steps of 20 ms: the stream runs for at least 2 s, far longer than it takes to open
    // the other two connections.
    let mut served = Served::start(config, Duration::from_millis(20)).await;

    let mut stream = served.connect().await;
    let body = r#"{"prompt": [1, 2, 3], "max_tokens": 100, "ignore_eos": true, "stream": true}"#;
    let head = request_head(
        "/v1/completions",
        &format!("Connection: close\r\nContent-Length: {}\r\n", body.len()),
    );
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    let mut streamed = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&streamed).contains("data: ") {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the stream ended before its first event");
        streamed.extend_from_slice(&buffer[..n]);
    }

    let mut half_sent = served.connect().await;
    half_sent
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: tla")
        .await
        .unwrap();
    let mut idle = served.connect().await;
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: tlaloc\r\n\r\n")
        .await
        .unwrap();
    let n = idle.read(&mut buffer).await.unwrap();
    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
    // Let the server read the half-sent bytes before it is told to stop.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let engine = served.state.engine().unwrap().clone();
    assert_eq!(engine.stats().running, 1, "the stream is in flight");
    served.terminate();
    for (name, connection) in [("half-sent", &mut half_sent), ("idle", &mut idle)] {
        let rest = tokio::time::timeout(prompt_bound, wait_closed(connection))
            .await
            .unwrap_or_else(|_| panic!("the {name} connection is still open"));
        assert!(
            rest.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&rest)
        );
    }
    streamed.extend(read_to_close(&mut stream).await);
    let text = String::from_utf8_lossy(&streamed);
    assert!(text.contains("data: [DONE]"), "{text}");
    // The stream ran to its budget.
    assert_eq!(text.matches("\"finish_reason\":\"length\"").count(), 1);
    tokio::time::timeout(prompt_bound, served.task)
        .await
        .expect("serve returns once the stream is done")
        .unwrap()
        .unwrap();
}

/// The drain is bounded: a generation that outlasts the shutdown timeout is cut when it
/// passes, and `serve` returns.
#[tokio::test]
async fn the_drain_ends_at_the_shutdown_timeout() {
    let mut config = ServerConfig::new("tiny");
    config.shutdown_timeout = Duration::from_secs(1);
    let bound = config.shutdown_timeout;
    // 100 steps of 50 ms: at least five times the bound.
    let mut served = Served::start(config, Duration::from_millis(50)).await;
    let mut stream = served.connect().await;
    let body = r#"{"prompt": [1, 2, 3], "max_tokens": 100, "ignore_eos": true}"#;
    let head = request_head(
        "/v1/completions",
        &format!("Content-Length: {}\r\n", body.len()),
    );
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    while served
        .state
        .engine()
        .unwrap()
        .stats()
        .generation_tokens_total
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopping = Instant::now();
    served.terminate();
    tokio::time::timeout(bound * 3, served.task)
        .await
        .expect("serve returns once the drain bound has passed")
        .unwrap()
        .unwrap();
    let took = stopping.elapsed();
    assert!(took >= bound.mul_f64(0.9), "returned after {took:?}");
    let rest = wait_closed(&mut stream).await;
    assert!(
        rest.is_empty(),
        "the cut request got an answer: {}",
        String::from_utf8_lossy(&rest)
    );
}
