"""`tlaloc serve` spoken to on raw sockets and through `urllib`: clients that send their headers
slowly, declare a body over the limit, send such a body whole before reading, stall in the
middle of a body, or are in the middle of a request when the server is told to stop.

Every wait is derived from the bound the server was started with (see conftest); the only fixed
numbers are generous limits on how long a connect or an upload may take, which guard against a
hang and are not what is tested."""

import json
import select
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import (BOUNDED_BODY_IDLE_TIMEOUT_S, BOUNDED_HEADER_READ_TIMEOUT_S,
                      BOUNDED_MAX_BODY_BYTES)
from serverctl import Server

BIG_BODY_BYTES = 64 << 20
CONNECT_GUARD_S = 30.0
UPLOAD_GUARD_S = 120.0


def request_head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: tlaloc", "Content-Type: application/json",
             *headers, "", ""]
    return "\r\n".join(lines).encode()


def read_until_closed(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(1 << 16):
        data += chunk
    return bytes(data)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data[:200]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ")[1]), headers, body


def connect(server: Server, timeout: float | None) -> socket.socket:
    """A connection whose reads and writes wait at most `timeout` (None: not at all)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=CONNECT_GUARD_S)
    sock.settimeout(timeout)
    return sock


def test_slow_headers_are_closed_at_the_header_read_timeout(bounded):
    # 200 connections each send a byte every tenth of the timeout and never finish their head;
    # each is timed from its own connect.
    bound = BOUNDED_HEADER_READ_TIMEOUT_S
    head = b"POST /v1/completions HTTP/1.1\r\nHost: tlaloc\r\nX-Padding: "
    opened_at = {}
    for _ in range(200):
        s = connect(bounded, 0.0)
        opened_at[s] = time.monotonic()
    sent = {s: 0 for s in opened_at}
    closed_after = {}
    try:
        while sent and time.monotonic() < max(opened_at.values()) + 4 * bound:
            readable, _, _ = select.select(list(sent), [], [], bound / 10)
            for s in readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                assert not data, f"the server answered a head that never ended: {data!r}"
                closed_after[s] = time.monotonic() - opened_at[s]
                del sent[s]
            for s in list(sent):
                try:
                    s.send(head[sent[s]:sent[s] + 1] or b"a")
                    sent[s] += 1
                except BlockingIOError:
                    pass
                except OSError:
                    closed_after[s] = time.monotonic() - opened_at[s]
                    del sent[s]
        assert not sent, f"{len(sent)} of {len(opened_at)} slow connections still open " \
                         f"{4 * bound} s after connecting (header read timeout {bound} s)"
        assert min(closed_after.values()) >= 0.9 * bound
    finally:
        for s in opened_at:
            s.close()
    # The server still serves everyone else.
    with connect(bounded, 4 * bound) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: tlaloc\r\nConnection: close\r\n\r\n")
        assert parse_response(read_until_closed(s))[0] == 200


def test_a_declared_oversize_content_length_is_413_at_once(bounded):
    # Nothing of the body is sent: a 408 here would mean the server waited for it.
    with connect(bounded, 4 * BOUNDED_BODY_IDLE_TIMEOUT_S) as s:
        s.sendall(request_head("/v1/completions", "Content-Length: 99999999999999"))
        status, headers, body = parse_response(read_until_closed(s))
    assert status == 413, body
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert str(BOUNDED_MAX_BODY_BYTES) in error["message"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_64_mib_body_sent_whole_reads_the_413_by_raw_socket(bounded, framing):
    body = b"x" * BIG_BODY_BYTES
    if framing == "chunked":
        step = 1 << 20
        wire = b"".join(b"%x\r\n%s\r\n" % (step, body[i:i + step])
                        for i in range(0, len(body), step)) + b"0\r\n\r\n"
        request = request_head("/v1/completions", "Transfer-Encoding: chunked") + wire
    else:
        request = request_head("/v1/completions", f"Content-Length: {len(body)}") + body
    with connect(bounded, UPLOAD_GUARD_S) as s:
        s.sendall(request)  # a reset here is the bug: the client never sees the answer
        status, headers, answer = parse_response(read_until_closed(s))
    assert status == 413, answer
    assert headers["connection"] == "close"
    assert str(BOUNDED_MAX_BODY_BYTES) in json.loads(answer)["error"]["message"]


def test_a_64_mib_body_sent_whole_reads_the_413_by_urllib(bounded):
    request = urllib.request.Request(f"{bounded.url}/v1/completions", method="POST",
                                     data=b"x" * BIG_BODY_BYTES,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=UPLOAD_GUARD_S)
    assert e.value.code == 413
    assert e.value.headers["Connection"] == "close"
    assert str(BOUNDED_MAX_BODY_BYTES) in json.loads(e.value.read())["error"]["message"]


def test_a_stalled_body_is_408_after_the_body_idle_timeout(bounded):
    idle = BOUNDED_BODY_IDLE_TIMEOUT_S
    with connect(bounded, 4 * idle) as s:
        s.sendall(request_head("/v1/completions", "Content-Length: 100") + b'{"prompt": ')
        asked = time.monotonic()
        status, headers, body = parse_response(read_until_closed(s))
        took = time.monotonic() - asked
    assert status == 408, body
    assert took >= 0.9 * idle
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_sigterm_with_a_half_sent_request_exits_within_the_bound(tiny_artifact):
    # Both bounds long: the process must exit because the drain closes the half-sent
    # connection, not because either runs out.
    header_read_timeout_s, shutdown_timeout_s = 30.0, 30.0
    server = Server(tiny_artifact, "tiny", "--header-read-timeout", str(header_read_timeout_s),
                    "--shutdown-timeout", str(shutdown_timeout_s))
    try:
        with connect(server, header_read_timeout_s) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: tla")
            # A whole request on another connection: the server has taken the first by now.
            with connect(server, header_read_timeout_s) as other:
                other.sendall(b"GET /health HTTP/1.1\r\nHost: tlaloc\r\nConnection: close\r\n\r\n")
                assert parse_response(read_until_closed(other))[0] == 200
            server.terminate()
            bound = min(header_read_timeout_s, shutdown_timeout_s) / 4
            assert server.proc.wait(bound) == 0, server.log_text()
    finally:
        server.stop()
