"""The simulated vLLM's HTTP side: its routes, and the OpenAI-style answers (completions, chat,
streams, models, metrics) a request handler gives on the server's socket.

Standard library only: copied into the rehearsal host's venv with the rest of this package.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._simserver import ApiServer
    from ._simserving import Reply

ROUTES = [
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/docs/oauth2-redirect", "GET, HEAD"),
    ("/redoc", "GET, HEAD"),
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "GET"),
    ("/ping", "POST"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/version", "GET"),
    ("/v1/responses", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/metrics", "GET"),
]


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, handler: Any, app: ApiServer):
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.app = app
        self.server_activate()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def app(self) -> ApiServer:
        return self.server.app  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._access(status)

    def _access(self, status: int) -> None:
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        self.app.log.access(client, self.requestline, f"{status} {HTTPStatus(status).phrase}")

    def _json(self, status: int, document: Any) -> None:
        self._send(status, json.dumps(document).encode())

    def _authorised(self) -> bool:
        key = self.app.args.api_key or os.environ.get("VLLM_API_KEY")
        if not key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        app = self.app
        path = self.path.split("?")[0]
        if not self._authorised():
            return
        if path == "/health":
            self._send(503 if app.engine_gone.is_set() else 200)
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/version":
            self._json(200, {"version": app.version})
        elif path == "/metrics":
            self._send(200, app.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/load":
            self._json(200, {"server_load": 0})
        elif path == "/ping":
            self._send(503 if app.engine_gone.is_set() else 200, b"{}")
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._json(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._authorised():
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            if path == "/ping":
                self._send(200, b"{}")
            else:
                self._json(404 if path not in dict(ROUTES) else 405, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except ValueError as error:
            self._error(400, f"Invalid JSON body: {error}", "BadRequestError")
            return
        app = self.app
        if app.engine_gone.is_set():
            self._error(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            )
            return
        name = body.get("model") or app.served[0]
        if name not in app.served:
            self._error(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
            return
        with app.request_in_flight():
            if path == "/v1/completions":
                self._completion(body, name)
            else:
                self._chat(body, name)

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._json(
            status, {"error": {"message": message, "type": kind, "param": param, "code": status}}
        )

    def _completion(self, body: dict[str, Any], name: str) -> None:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        max_tokens = int(body.get("max_tokens") or 16)
        reply = self.app.answer(str(prompt), max_tokens, bool(body.get("ignore_eos")))
        text, prompt_tokens, count, finish = (
            reply.text,
            reply.prompt_tokens,
            reply.count,
            reply.finish,
        )
        ident = "cmpl-" + hashlib.sha256(f"{time.time()}{prompt}".encode()).hexdigest()[:32]
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            choice.update(prompt_token_ids=None, token_ids=list(reply.token_ids))
        document = {
            "id": ident,
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
            "usage": _usage(prompt_tokens, count),
        }
        if body.get("stream"):
            self._stream(document, "text_completion", reply, bool(body.get("return_token_ids")))
        else:
            reply.wait()
            self._json(200, document)

    def _chat(self, body: dict[str, Any], name: str) -> None:
        messages = body.get("messages") or []
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 64)
        reply = self.app.answer(prompt, max_tokens, bool(body.get("ignore_eos")))
        text, prompt_tokens, count, finish = (
            reply.text,
            reply.prompt_tokens,
            reply.count,
            reply.finish,
        )
        reasoning = "The request is simple." if self.app.args.reasoning_parser else None
        message = {
            "role": "assistant",
            "content": text.strip(),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": reasoning,
        }
        calls = _tool_calls(body, self.app) if self.app.args.enable_auto_tool_choice else []
        if calls:
            message.update(content=None, tool_calls=calls)
            finish = "tool_calls"
        ident = "chatcmpl-" + hashlib.sha256(f"{time.time()}{prompt}".encode()).hexdigest()[:32]
        document = {
            "id": ident,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
            "usage": _usage(prompt_tokens, count),
        }
        if body.get("stream"):
            self._stream(document, "chat.completion.chunk", reply, False)
        else:
            reply.wait()
            self._json(200, document)

    def _stream(self, document: dict[str, Any], kind: str, reply: Reply, ids: bool) -> None:
        """Server-sent events: a chunk a token as it is made (with its id when asked,
        ``return_token_ids``), one with the finish reason, then [DONE]."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("connection", "close")
        self.end_headers()
        base = {
            "id": document["id"],
            "object": kind,
            "created": document["created"],
            "model": document["model"],
        }
        chat = kind.startswith("chat")
        for n, piece in enumerate(reply.paced()):
            payload: dict[str, Any]
            if chat:
                delta = {"content": piece.lstrip() if n == 0 else piece}
                payload = {"delta": {"role": "assistant", **delta} if n == 0 else delta}
            else:
                payload = {"text": piece}
                if ids:
                    payload["token_ids"] = [reply.token_ids[n]]
            chunk = {
                **base,
                "choices": [{"index": 0, **payload, "logprobs": None, "finish_reason": None}],
            }
            self._event(chunk)
        finish = document["choices"][0]["finish_reason"]
        empty = {"delta": {}} if chat else {"text": ""}
        self._event(
            {**base, "choices": [{"index": 0, **empty, "logprobs": None, "finish_reason": finish}]}
        )
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True
        self._access(200)

    def _event(self, event: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.flush()


# A value of each JSON schema type, for the simulated tool call's arguments.
_SAMPLE_VALUES = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": [],
                  "object": {}}  # fmt: skip


def _tool_calls(body: dict[str, Any], app: ApiServer) -> list[dict[str, Any]]:
    """With tools offered (and auto tool choice on), a call of the first one whose arguments
    fill each property with a value of its type (an enum's first); the ``bad-tool-args``
    serving fault leaves the required ones out, as a parser that loses them would."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("function")]
    if not tools or body.get("tool_choice") == "none":
        return []
    function = tools[0]["function"]
    schema = function.get("parameters") or {}
    arguments = {
        key: (spec.get("enum") or [_SAMPLE_VALUES.get(spec.get("type"), "x")])[0]
        for key, spec in (schema.get("properties") or {}).items()
    }
    if app.replies.fault == "bad-tool-args":
        arguments = {k: v for k, v in arguments.items() if k not in schema.get("required", [])}
    ident = "chatcmpl-tool-" + hashlib.sha256(json.dumps(arguments).encode()).hexdigest()[:16]
    call = {"name": function.get("name"), "arguments": json.dumps(arguments)}
    return [{"id": ident, "type": "function", "function": call}]


def _usage(prompt_tokens: int, count: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + count,
        "completion_tokens": count,
        "prompt_tokens_details": None,
    }
