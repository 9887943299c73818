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
"""

import hashlib
import http.client
import json
import threading
import time


def one_request(args, request):
    """Send one streamed completion; what came back, timed."""
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
    last = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=args["timeout"])
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
        out["ok"] = True
    except (OSError, ValueError, http.client.HTTPException) as error:
        out["error"] = type(error).__name__ + ": " + str(error)
    finally:
        out["latency"] = time.monotonic() - started
        out["tokens"] = len(ids) or len(text)
        out["ids_sha256"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest() if ids else ""
        out["ids_head"] = ids[: args.get("keep_ids", 0)]
        out["text_head"] = "".join(text)[: args.get("keep_text", 0)]
    return out


def run_all(args, requests):
    """The requests, ``concurrency`` at a time, answers in the requests' order."""
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
            answers[index] = one_request(args, requests[index])

    workers = [threading.Thread(target=worker) for _ in range(max(1, args["concurrency"]))]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return answers


def main(args):
    requests = args["requests"]
    warmup = requests[: args.get("warmup", 0)]
    if warmup:
        run_all(args, warmup)
    measured = requests[len(warmup) :]
    started = time.monotonic()
    answers = run_all(args, measured)
    return {"duration": time.monotonic() - started, "answers": answers}
