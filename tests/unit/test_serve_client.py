"""The serve_client probe's watch of /metrics: a server whose counters stand still while
requests are in flight is hung, and the load (the client's requests, or a command's session) is
ended within the stall, not at the request timeout. Run as the host runs it (probes.run_local)
against a small HTTP server on loopback."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from opsbook.remote import probes
from opsbook.steps import qualify_matrix as matrix

STALL = 1.5
WATCH = {**matrix.Target(0, "m", "/m", "/p").watch(), "stall": STALL, "interval": 0.2}


class Server(http.server.ThreadingHTTPServer):
    """Answers /metrics with ``running`` requests and counters that move only while
    ``tokens_flow``; a completion streams a token every 50 ms while they flow, else none."""

    daemon_threads = True
    running = 0
    generated = 0
    tokens_flow = True
    stop = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        s = self.server
        body = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0"}} {s.running}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0"}} {s.generated}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        s = self.server
        self.rfile.read(int(self.headers["Content-Length"]))
        s.running += 1
        try:
            self.send_response(200)
            self.end_headers()
            for n in range(8):
                while not s.tokens_flow and not s.stop.is_set():
                    time.sleep(0.05)
                s.generated += 1
                chunk = {"choices": [{"text": "a", "token_ids": [n]}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass
        finally:
            s.running -= 1


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server(("127.0.0.1", 0), Handler)
    served.stop = threading.Event()
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.stop.set()
        served.shutdown()
        served.server_close()


def client_args(server: Server, count: int) -> dict:
    return {
        "port": server.server_address[1], "model": "m", "concurrency": 2, "warmup": 0,
        "timeout": 60, "requests": [{"prompt": "p", "max_tokens": 8}] * count, "watch": WATCH,
    }  # fmt: skip


def test_a_server_that_makes_tokens_is_not_hung(server: Server) -> None:
    answer = probes.run_local("serve_client", client_args(server, 4))
    assert answer["hung"] is None
    assert [a["tokens"] for a in answer["answers"]] == [8] * 4


def test_counters_standing_still_with_requests_running_end_the_requests_within_the_stall(
    server: Server,
) -> None:
    server.tokens_flow = False
    started = time.monotonic()
    answer = probes.run_local("serve_client", client_args(server, 6))
    took = time.monotonic() - started
    assert took < STALL + 5, took  # not the 60 s request timeout
    hung = answer["hung"]
    assert hung["running"] == 2 and hung["generation"] == 0 and hung["seconds"] >= STALL
    errors = [a["error"] for a in answer["answers"]]
    assert all(e.startswith("ended: the server was hung") for e in errors[:2]), errors
    assert errors[2:] == ["not sent: the server was hung"] * 4


def test_a_watched_command_is_ended_with_its_session_when_the_server_hangs(
    server: Server,
) -> None:
    server.running = 3  # requests of another client, never answered
    args = {
        "port": server.server_address[1], "timeout": 60, "watch": WATCH,
        "command": [sys.executable, "-c", "import time; print('started', flush=True); "
                    "time.sleep(60)"],
    }  # fmt: skip
    started = time.monotonic()
    answer = probes.run_local("serve_client", args)
    assert time.monotonic() - started < STALL + 8
    assert answer["hung"]["running"] == 3
    assert answer["exit_code"] == -15 and "started" in answer["stdout"]


def test_a_command_runs_to_its_end_with_the_key_in_its_env(server: Server) -> None:
    args = {
        "port": server.server_address[1], "timeout": 60, "watch": WATCH, "bearer": "k-123",
        "command": [sys.executable, "-c", "import os; print(os.environ['OPENAI_API_KEY'])"],
    }  # fmt: skip
    answer = probes.run_local("serve_client", args)
    assert answer == {"exit_code": 0, "stdout": "k-123\n", "stderr": "", "hung": None}
