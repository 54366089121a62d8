"""The front door over a real socket: a stalled body gets 408, a client that leaves mid-body is no 500."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("fastapi")

from test_service_support import ServiceServer, load_scorer, metric_value

from suffice.serving.service import create_app, load_service_config

HEAD = ("POST /v1/sufficiency HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n").encode()


@pytest.fixture(scope="module")
def server(bundles):
    cfg = load_service_config(None, ["--limits.body_timeout_s=0.5"])
    app = create_app(cfg, load_scorer(bundles["sufficiency"]), api_keys=[], upstream_api_key=None)
    with ServiceServer(app) as s:
        yield s


def _metrics(server) -> str:
    with server.client() as c:
        return c.get("/metrics").text


def test_a_stalled_body_gets_408_in_time(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(HEAD + b'{"question": "Where')
        t0 = time.monotonic()
        chunks = [sock.recv(65536)]
        waited = time.monotonic() - t0
        while chunks[-1]:  # the server closes the connection after the 408
            chunks.append(sock.recv(65536))
        reply = b"".join(chunks).decode()
    assert reply.startswith("HTTP/1.1 408") and "limits.body_timeout_s" in reply, reply
    assert waited < 5
    assert metric_value(_metrics(server), "http_requests_total", {"route": "/v1/sufficiency", "status": "408"}) >= 1


def test_a_client_that_leaves_mid_body_is_not_a_server_error(server):
    before = _metrics(server)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(HEAD + b'{"question": "Where')
        time.sleep(0.05)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = _metrics(server)
        if metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "499"}) >= 3:
            break
        time.sleep(0.05)
    assert metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "499"}) >= 3, text
    assert metric_value(text, "http_requests_total", {"route": "/v1/sufficiency", "status": "500"}) == \
        metric_value(before, "http_requests_total", {"route": "/v1/sufficiency", "status": "500"})
