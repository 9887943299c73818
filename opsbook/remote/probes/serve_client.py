"""Probe: a small load client run on the host, against the model server on its own port.

Stdlib only (Python 3.8+). Where the host's venv has no ``vllm bench serve`` (or for the
correctness checks, which need the token ids) it sends streamed ``/v1/completions`` requests,
``concurrency`` at a time, and times each: time to first token, the gaps between tokens, the
whole latency. ``warmup`` requests go first and are not reported. Each request asks for its
token ids (``return_token_ids``: ``vllm/entrypoints/openai/completion/protocol.py`` and
``serving.py`` in vLLM 0.32.0; a chunk's ``token_ids`` is its delta), and the answer carries their
sha256, so that two runs compare tokens, never text.

Args: ``port``, ``model``, ``requests`` (``[{"prompt": str, "max_tokens": int}]``),
``concurrency``, ``warmup``, ``timeout`` (seconds a request may take), ``bearer`` (the
server's API key), ``keep_ids`` (how many token ids each answer keeps, for the degenerate
output check), ``keep_text`` (characters of text kept).

Or, instead of ``requests``, ``command``: an argv (``vllm bench serve ...``) run in a session of
its own, the key in its ``OPENAI_API_KEY``, given ``timeout`` seconds; the answer is its
``exit_code`` and the tails of its ``stdout`` and ``stderr``.

Or ``chat``: request bodies sent one by one, unstreamed, to ``/v1/chat/completions`` (the model
filled in); the answer is each reply's first ``message`` (``tool_calls``, ``content``).

With ``requests`` or ``command``, and ``watch`` (``{"running", "waiting", "generation",
"prompt"}``: the release's metric names; ``stall``: seconds; ``interval``) it reads
``/metrics`` while the load runs. When requests are in flight (the server's running or waiting
gauge, or the client's own) and neither token counter moves for ``stall`` seconds, the server
is hung (``/health`` can stay 200 for hours: vllm issue 51663): the load is ended at once (the
client's connections closed, or the command's session sent SIGTERM, then SIGKILL) and the
answer's ``hung`` holds the figures.
"""

import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time


def one_request(args, request, load=None):
    """Send one streamed completion; what came back, timed. Its connection is kept in
    ``load`` while it runs, so that a hang ends it."""
    body = {
        "model": args["model"],
        "prompt": request["prompt"],
        "max_tokens": request["max_tokens"],
        "temperature": 0,
        "stream": True,
        "ignore_eos": bool(request.get("ignore_eos", True)),
        "return_token_ids": True,
    }
    headers = {"Content-Type": "application/json"}
    if args.get("bearer"):
        headers["Authorization"] = "Bearer " + args["bearer"]
    out = {"ok": False, "error": "", "ttft": None, "itl": [], "latency": None, "tokens": 0}
    ids, text = [], []
    started = time.monotonic()
    last = sock = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=args["timeout"])
        if load is not None:
            # The socket itself: a response that closes the connection takes it from conn.
            conn.connect()
            sock = conn.sock
            load.opened(sock)
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        answer = conn.getresponse()
        if answer.status != 200:
            said = answer.read(300).decode("utf-8", "replace")
            out["error"] = "HTTP " + str(answer.status) + ": " + said
            return out
        for raw in answer:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            choice = (chunk.get("choices") or [{}])[0]
            delta_ids = choice.get("token_ids") or []
            piece = choice.get("text") or ""
            if not delta_ids and not piece:
                continue
            now = time.monotonic()
            if last is None:
                out["ttft"] = now - started
            else:
                out["itl"].append(now - last)
            last = now
            ids.extend(delta_ids)
            text.append(piece)
        conn.close()
        if load is not None and load.hung:
            # The watch shut the socket: what came before it is no whole answer.
            raise OSError("the connection was shut")
        out["ok"] = True
    except (OSError, ValueError, http.client.HTTPException) as error:
        out["error"] = type(error).__name__ + ": " + str(error)
        if load is not None and load.hung:
            out["error"] = "ended: the server was hung (" + out["error"] + ")"
    finally:
        if load is not None:
            load.closed(sock)
        out["latency"] = time.monotonic() - started
        out["tokens"] = len(ids) or len(text)
        out["ids_sha256"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest() if ids else ""
        out["ids_head"] = ids[: args.get("keep_ids", 0)]
        out["text_head"] = "".join(text)[: args.get("keep_text", 0)]
    return out


def run_all(args, requests, load=None):
    """The requests, ``concurrency`` at a time, answers in the requests' order; once the
    server is hung, the requests not sent are answered "not sent"."""
    answers = [None] * len(requests)
    next_index = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                index = next_index[0]
                next_index[0] += 1
            if index >= len(requests):
                return
            if load is not None and load.hung:
                answers[index] = not_sent()
                continue
            answers[index] = one_request(args, requests[index], load)

    workers = [threading.Thread(target=worker) for _ in range(max(1, args["concurrency"]))]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return answers


def not_sent():
    error = "not sent: the server was hung"
    return {
        "ok": False,
        "error": error,
        "ttft": None,
        "itl": [],
        "latency": 0.0,
        "tokens": 0,
        "ids_sha256": "",
        "ids_head": [],
        "text_head": "",
    }


class Load:
    """What runs against the server: the client's open sockets (or the command), how many
    requests are in flight, and whether the watch found the server hung."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sockets = set()
        self.hung = None
        self.process = None

    def opened(self, sock):
        with self.lock:
            self.sockets.add(sock)
        if self.hung:
            self.end()

    def closed(self, sock):
        with self.lock:
            self.sockets.discard(sock)

    def in_flight(self):
        with self.lock:
            return len(self.sockets)

    def end(self):
        """End the load: shut each open socket (its reader gets an error or the end at
        once), or the command's whole session (its process group, started by this probe)."""
        with self.lock:
            sockets = list(self.sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.process is not None:
            stop_session(self.process)


def stop_session(process):
    """SIGTERM to the session this probe started for the command, SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except OSError:
            return
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue


def read_counters(args, names):
    """The gauges and counters ``names`` maps (running, waiting, generation, prompt), summed
    over their labels; None when /metrics did not answer."""
    headers = {}
    if args.get("bearer"):
        headers["Authorization"] = "Bearer " + args["bearer"]
    try:
        conn = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=5)
        conn.request("GET", "/metrics", headers=headers)
        answer = conn.getresponse()
        text = answer.read().decode("utf-8", "replace")
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    if answer.status != 200:
        return None
    wanted = {name: role for role, name in names.items() if isinstance(name, str)}
    found = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        role = wanted.get(name)
        if role is None:
            continue
        try:
            found[role] += float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    return found


def watch(args, load, done):
    """Read /metrics every ``interval`` until ``done`` is set; hung (``load.hung``, and the
    load ended) when requests are in flight and no token counter moved for ``stall`` s."""
    spec = args["watch"]
    names = {k: spec.get(k) for k in ("running", "waiting", "generation", "prompt")}
    stall = float(spec.get("stall", 15.0))
    started = time.monotonic()
    moved_at, last = started, None
    while not done.wait(float(spec.get("interval", 1.0))):
        now = time.monotonic()
        seen = read_counters(args, names)
        if seen is None:
            continue
        busy = seen["running"] > 0 or seen["waiting"] > 0 or load.in_flight() > 0
        tokens = (seen["generation"], seen["prompt"])
        if last is None or tokens != last or not busy:
            moved_at, last = now, tokens
            continue
        if now - moved_at >= stall:
            load.hung = dict(
                seen,
                seconds=round(now - moved_at, 1),
                after=round(now - started, 1),
                in_flight=load.in_flight(),
            )
            load.end()
            return


def watched(args, load, work):
    """``work()`` with the watch beside it (when asked for)."""
    if not args.get("watch"):
        return work()
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(args, load, done), daemon=True)
    watcher.start()
    try:
        return work()
    finally:
        done.set()
        watcher.join(10)


def run_command(args, load):
    """The command in a session of its own, given ``timeout`` seconds; its exit and tails."""
    env = dict(os.environ)
    if args.get("bearer"):
        env["OPENAI_API_KEY"] = args["bearer"]
    process = subprocess.Popen(
        args["command"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    load.process = process
    try:
        out, err = process.communicate(timeout=args["timeout"])
    except subprocess.TimeoutExpired:
        stop_session(process)
        out, err = process.communicate()
    return {"exit_code": process.returncode, "stdout": tail(out), "stderr": tail(err)}


def tail(data):
    return data.decode("utf-8", "replace")[-2000:]


def one_chat(args, body):
    """One unstreamed chat completion: its first message, or the error."""
    headers = {"Content-Type": "application/json"}
    if args.get("bearer"):
        headers["Authorization"] = "Bearer " + args["bearer"]
    try:
        conn = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=args["timeout"])
        conn.request("POST", "/v1/chat/completions", json.dumps(dict(body, model=args["model"])),
                     headers)  # fmt: skip
        answer = conn.getresponse()
        said = answer.read().decode("utf-8", "replace")
        conn.close()
        if answer.status != 200:
            return {"ok": False, "error": "HTTP " + str(answer.status) + ": " + said[:300]}
        message = (json.loads(said).get("choices") or [{}])[0].get("message") or {}
        return {"ok": True, "message": message}
    except (OSError, ValueError, http.client.HTTPException) as error:
        return {"ok": False, "error": type(error).__name__ + ": " + str(error)}


def main(args):
    if args.get("chat"):
        return {"answers": [one_chat(args, body) for body in args["chat"]]}
    load = Load()
    if args.get("command"):
        answer = watched(args, load, lambda: run_command(args, load))
        answer["hung"] = load.hung
        return answer
    requests = args["requests"]
    warmup = requests[: args.get("warmup", 0)]
    measured = requests[len(warmup) :]
    timing = {}

    def work():
        if warmup:
            run_all(args, warmup, load)
        timing["started"] = time.monotonic()
        return run_all(args, measured, load)

    answers = watched(args, load, work)
    return {"duration": time.monotonic() - timing["started"], "answers": answers, "hung": load.hung}
