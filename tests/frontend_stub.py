"""A tiny OpenAI-compatible server on loopback for frontend tests: known, injected costs.

It answers `/v1/models`, `/tokenize` (one token per whitespace word) and `/v1/completions`
(streamed as SSE or not), sleeping the configured seconds so a probe can recover them. It stops by
itself after `max_requests` requests or `lifetime_s` seconds, whichever comes first.

Streams share one "event loop" (a lock), as vLLM's API server does: every chunk holds it for
`per_stream_s`, and a stream's first chunk waits for the loop to work through one chunk of every
open stream (itself included) -- the step that carries a new request's first token carries every
running request's next token too. So the first chunk of a request sent while N others stream comes
`per_stream_s` x N later than alone: what the probe's per-stream fit recovers.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(slots=True)
class StubCosts:
    http_s: float = 0.004
    tokenize_s_per_token: float = 20e-6
    step_s: float = 0.002  # one engine step (one output token)
    per_stream_s: float = 0.001  # the loop's output work per open stream per step


class StubServer:
    def __init__(self, costs: StubCosts, max_requests: int = 200, lifetime_s: float = 60.0):
        self.costs, self.max_requests = costs, max_requests
        self.num_requests = 0
        self.loop = threading.Lock()  # the API server's one event loop
        self.num_streams = 0  # streams open now
        self._count_lock = threading.Lock()
        handler = _make_handler(self)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._timer = threading.Timer(lifetime_s, self.close)
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "StubServer":
        self._timer.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(server: StubServer):
    costs = server.costs

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _count(self) -> bool:
            with server._count_lock:
                server.num_requests += 1
            if server.num_requests > server.max_requests:
                self.send_error(429, "stub request cap reached")
                return False
            time.sleep(costs.http_s)
            return True

        def _json(self, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self._count():
                self._json({"object": "list", "data": [{"id": "stub", "object": "model"}]})

        def do_POST(self) -> None:
            if not self._count():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            num_tokens = len(str(body.get("prompt", "")).split())
            time.sleep(costs.tokenize_s_per_token * num_tokens)
            if self.path == "/tokenize":
                return self._json({"count": num_tokens, "tokens": list(range(num_tokens))})
            n = int(body.get("max_tokens", 16))
            if not body.get("stream"):
                time.sleep(costs.step_s * n)
                return self._json({"choices": [{"text": "x" * n}], "usage": {"completion_tokens": n}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with server._count_lock:
                server.num_streams += 1
            try:
                self._stream(n)
            except OSError:
                pass  # the client closed the stream (the server aborts the request)
            finally:
                with server._count_lock:
                    server.num_streams -= 1

        def _stream(self, n: int) -> None:
            for i in range(n):
                time.sleep(costs.step_s)
                with server.loop:  # the step's output work: every open stream's chunk for the first
                    time.sleep(costs.per_stream_s * (server.num_streams if i == 0 else 1))
                    self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                    self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler
