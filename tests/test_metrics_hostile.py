"""Hostile /metrics clients against a real daemon: a flood of idle connections, resets and
silent clients cost the daemon a bounded number of descriptors and log lines, and the FUSE edge
and the control files answer as usual meanwhile."""
from __future__ import annotations

import os
import socket
import struct
import time

import pytest

from helpers import free_port, wait_until
from mokkafs.daemon.metrics_server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S

pytestmark = pytest.mark.level("mount")

FLOOD = 600


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.fixture
def metrics_node(node_factory):
    node = node_factory(gpus=2, mount=False)
    node.port = free_port()
    node.mount(("--metrics", f"127.0.0.1:{node.port}"))
    return node


def test_a_flood_of_idle_connections_is_capped_and_the_node_answers_meanwhile(metrics_node):
    node = metrics_node
    pid = node.daemon_pid()
    assert scrape(node.port).startswith(b"HTTP/1.1 200 OK")
    before = fds(pid)
    held = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", node.port))
            except BlockingIOError:
                pass
            held.append(s)
        time.sleep(1)
        assert fds(pid) <= before + MAX_CONNECTIONS + 8  # the rest were closed at once
        for _ in range(5):  # the FUSE edge and the control files are not held up
            start = time.monotonic()
            assert node.write("gpu0/inject_xid", b"48\n") == 0
            assert "Xid" in node.read("gpu0/events") or node.read("gpu0/info")
            assert time.monotonic() - start < 1.0
    finally:
        for s in held:
            s.close()
    # The held connections are dropped once idle past the timeout; scrapes work again.
    wait_until(lambda: fds(pid) <= before + 2, "idle connections dropped", timeout=REQUEST_TIMEOUT_S + 10)
    assert scrape(node.port).startswith(b"HTTP/1.1 200 OK")


def test_resets_and_silent_clients_cost_a_few_log_lines_not_one_each(metrics_node):
    node = metrics_node
    log = node.state_dir / "daemon.log"
    lines = len(log.read_text().splitlines())
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, then a reset (RST)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    silent = socket.create_connection(("127.0.0.1", node.port), timeout=REQUEST_TIMEOUT_S + 10)
    start = time.monotonic()
    assert silent.recv(1) == b""  # a client that sends nothing is dropped at the timeout
    assert time.monotonic() - start < REQUEST_TIMEOUT_S + 5
    silent.close()
    assert scrape(node.port).startswith(b"HTTP/1.1 200 OK")
    grown = log.read_text().splitlines()[lines:]
    assert len(grown) < 10, grown
