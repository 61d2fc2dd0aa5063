"""A local OpenAI-compatible chat-completions server: a test peer, not part of the product.

No LLM can be reached from these machines, so the ``openai`` summarizer and extractor are tested against
this server. It speaks the real wire protocol over real HTTP (stdlib ``ThreadingHTTPServer`` on port 0):

- ``POST /v1/chat/completions`` with ``Authorization: Bearer <key>``; a wrong or missing key gets 401
  with OpenAI's error body shape.
- The reply carries ``choices[0].message.content`` and ``usage`` (prompt/completion/total tokens).
- A programmable responder decides the content (or a status, or a delay); every request is logged.

Usage::

    from peers.openai_compat import OpenAICompatServer, openai_server  # fixture import registers it

    def test_x(openai_server):
        openai_server.responder = lambda req: "summary text"
        ... httpx.post(openai_server.base_url + "/chat/completions", ...)
        assert openai_server.requests[0].body["model"] == "test-model"
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["LoggedRequest", "OpenAICompatServer", "Reply", "openai_server"]

DEFAULT_KEY = "test-key"


@dataclass(slots=True)
class Reply:
    """What a responder may return instead of plain text: full control over the answer."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0  # sleep before answering (to test client timeouts)
    prompt_tokens: int | None = None  # None: a rough count of the request's message text
    completion_tokens: int | None = None
    finish_reason: str = "stop"
    raw_body: bytes | None = None  # send these bytes as-is (to test malformed replies)


@dataclass(slots=True)
class LoggedRequest:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float = field(default_factory=time.time)

    @property
    def messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages", [])
        return msgs if isinstance(msgs, list) else []

    @property
    def prompt_text(self) -> str:
        """All message contents joined: what the model would have read."""
        return "\n".join(str(m.get("content", "")) for m in self.messages if isinstance(m, dict))


Responder = Callable[[LoggedRequest], "str | Reply"]


def _word_count(text: str) -> int:
    # A stand-in for the provider's tokenizer: the usage figures only need to be plausible and stable.
    return max(1, len(text.split())) if text else 0


def _echo_responder(req: LoggedRequest) -> str:
    return f"ok: {len(req.messages)} messages"


class OpenAICompatServer:
    """Threaded HTTP server on 127.0.0.1, port 0. Start with ``start()`` or use as a context manager."""

    def __init__(self, api_key: str = DEFAULT_KEY, responder: Responder | None = None) -> None:
        self.api_key = api_key
        self.responder: Responder = responder or _echo_responder
        self.requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> OpenAICompatServer:
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="openai-compat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAICompatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url`` (ends in ``/v1``, as the official SDK expects)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- test helpers ------------------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
        self.responder = _echo_responder

    def _log(self, req: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(req)


def _make_handler(server: OpenAICompatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx clients pool connections

        def log_message(self, format: str, *args: Any) -> None:
            # Silence per-request stderr lines; the request log is the record.
            return

        def _send_json(self, status: int, payload: dict[str, Any] | bytes) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            error = {"message": message, "type": kind, "param": None, "code": None}
            self._send_json(status, {"error": error})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send_json(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})
                return
            self._error(404, f"no route {self.path}", "invalid_request_error")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._error(400, "request body is not JSON", "invalid_request_error")
                return
            req = LoggedRequest(
                path=self.path, headers={k.lower(): v for k, v in self.headers.items()}, body=body
            )
            server._log(req)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}", "invalid_request_error")
                return
            if req.headers.get("authorization", "") != f"Bearer {server.api_key}":
                self._error(401, "Incorrect API key provided.", "invalid_request_error")
                return
            if not isinstance(body.get("messages"), list) or not body.get("model"):
                self._error(400, "'model' and 'messages' are required", "invalid_request_error")
                return
            try:
                out = server.responder(req)
            except Exception as exc:  # a responder bug must show up as a 500, not hang the client
                self._error(500, f"responder failed: {exc}", "server_error")
                return
            reply = out if isinstance(out, Reply) else Reply(content=out)
            if reply.delay_s > 0:
                time.sleep(reply.delay_s)
            if reply.raw_body is not None:
                self._send_json(reply.status, reply.raw_body)
                return
            if reply.status != 200:
                self._error(reply.status, reply.content or "error", "server_error")
                return
            prompt = reply.prompt_tokens if reply.prompt_tokens is not None else _word_count(req.prompt_text)
            completion = (
                reply.completion_tokens if reply.completion_tokens is not None else _word_count(reply.content)
            )
            self._send_json(
                200,
                {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply.content},
                            "finish_reason": reply.finish_reason,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                },
            )

    return Handler


@pytest.fixture
def openai_server() -> Iterator[OpenAICompatServer]:
    """A fresh server per test (port 0), stopped afterwards. Import this name into a test module or
    list ``peers.openai_compat`` in ``pytest_plugins`` to use it."""
    with OpenAICompatServer() as srv:
        yield srv
