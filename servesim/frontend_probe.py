"""Measure an OpenAI-compatible server's frontend costs (`servesim calibrate-frontend`).

Bounded probes, each separating costs of `simulator.frontend.FrontendConfig`:

1. `GET /v1/models`: a round trip that does no model work -> `http_s`.
2. `POST /tokenize` with prompts of growing length: time = a + b * tokens, least squares ->
   `tokenize_s_per_token` = b, `tokenize_base_s` = max(a - http_s, 0).
3. Per stream: with N streaming completions held open (N = 0, 8, 32, ... as --max-requests
   allows), the time to the first chunk of a 1-token streamed request. The API server's one
   event loop works through every running request's chunk of the step that carries that first
   token, so the time grows by one per-request output cost per open stream: least squares of it
   on N -> `output_per_request_s` = the slope. The intercept, minus HTTP, tokenization, one
   engine step (`engine_step_s`, from the cost model or 0), the step's fixed output pass and one
   request's output, is two hops: `engine_hop_s` is half of it (an upper bound with
   `engine_step_s` = 0: the step is folded into it). `output_step_s` cannot be told apart from
   the hops from outside the server: it stays at its default. On a real server the decode step
   also grows a little with the batch, which the slope takes in: an upper bound as well.

Every request has a timeout, the number of requests (background streams included) is capped and
checked up front, and the probe stops at a deadline: it never floods a server. It talks only to
the base URL it is given. Each figure is the fastest of `repeats` tries: noise on a busy client or
server only ever adds time, so the minimum is the least disturbed observation of a fixed cost.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from servesim.simulator.frontend import FrontendConfig
from servesim.traces.errors import InputError

WORD = "hello "  # a word most BPE tokenizers map to one token
PROBE_PROMPT_TOKENS = 8  # the streamed probes' prompt: WORD x 8
# Background streams open while a 1-token request's first chunk is timed (the per-stream probe);
# those that fit --max-requests beside the other probes are used.
STREAM_COUNTS = (0, 8, 32, 64, 128)
BACKGROUND_TOKENS = 4096  # each background stream's max_tokens: outlasts the probe; closed after it


@dataclass(slots=True)
class ProbeLimits:
    max_requests: int = 100  # HTTP requests in all (background streams count one each)
    request_timeout_s: float = 30.0
    deadline_s: float = 120.0  # whole probe
    prompt_words: tuple[int, ...] = (16, 256, 1024, 2048)  # tokenize probe sizes
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.max_requests < 10:
            raise InputError(f"got {self.max_requests}", field="--max-requests", allowed="an integer >= 10")
        if self.request_timeout_s <= 0 or self.deadline_s <= 0:
            raise InputError("timeouts must be > 0", field="--timeout-s")


# The probe's answers are a few KB (a tokenize result, a completion of a few tokens); anything
# far past these is a misbehaving server, and is cut off rather than held in memory.
MAX_BODY_BYTES = 4 * 2**20
MAX_LINE_BYTES = 256 * 2**10


@dataclass(slots=True)
class FrontendMeasurement:
    config: FrontendConfig
    num_requests: int
    samples: dict[str, list[float]] = field(default_factory=dict)  # probe name -> seconds


class _Client:
    """A bounded HTTP client for one base URL."""

    def __init__(self, base_url: str, limits: ProbeLimits):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"got {base_url!r}", field="--base-url", allowed="http://HOST:PORT or https://HOST:PORT")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.limits = limits
        self.count = 0
        self.stop_at = time.monotonic() + limits.deadline_s

    def connection(self) -> http.client.HTTPConnection:
        if self.count >= self.limits.max_requests:
            raise InputError(f"the probe needs more than {self.limits.max_requests} requests",
                             field="--max-requests", allowed="a larger cap")
        if time.monotonic() > self.stop_at:
            raise InputError(f"the probe ran past its {self.limits.deadline_s:g} s deadline", field="--deadline-s")
        self.count += 1
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.limits.request_timeout_s)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[float, list[tuple[float, bytes]]]:
        """Send one request; (seconds to the full response, [(seconds, line)] for each body line)."""
        conn = self.connection()
        try:
            t0 = time.perf_counter()
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, self.prefix + path, payload, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise InputError(f"{method} {path} answered HTTP {resp.status}: {resp.read(200)!r}",
                                 field="--base-url", allowed="an OpenAI-compatible server (vLLM, SGLang, ...)")
            return self._read_body(resp, method, path, t0)
        except (OSError, http.client.HTTPException) as exc:
            raise InputError(f"{method} {path}: {exc}", field="--base-url",
                             allowed="a reachable OpenAI-compatible server") from None
        finally:
            conn.close()


    def _read_body(self, resp: http.client.HTTPResponse, method: str, path: str,
                   t0: float) -> tuple[float, list[tuple[float, bytes]]]:
        """The body's lines, within MAX_BODY_BYTES and before the request's own timeout and the
        probe's deadline (a socket timeout alone restarts with every trickled byte)."""
        stop = min(time.monotonic() + self.limits.request_timeout_s, self.stop_at)
        lines, size = [], 0
        while True:
            line = resp.readline(MAX_LINE_BYTES + 1)
            if not line:
                return time.perf_counter() - t0, lines
            size += len(line)
            if size > MAX_BODY_BYTES or len(line) > MAX_LINE_BYTES:
                raise InputError(f"{method} {path}: the answer passed {MAX_BODY_BYTES // 2**20} MiB "
                                 f"(or a line {MAX_LINE_BYTES // 2**10} KiB) and was cut off", field="--base-url",
                                 allowed="an OpenAI-compatible server (a completion of a few tokens is a few KB)")
            if time.monotonic() > stop:
                raise InputError(f"{method} {path}: the answer was still arriving after "
                                 f"{self.limits.request_timeout_s:g} s (or the probe's deadline)", field="--timeout-s",
                                 allowed="a longer --timeout-s / --deadline-s, or a server that answers")
            lines.append((time.perf_counter() - t0, line.strip()))


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def _tokenize_probe(client: _Client, model: str, limits: ProbeLimits) -> tuple[list[float], list[float]]:
    """(token count, fastest tokenize round trip) per prompt size."""
    counts, times = [], []
    for words in limits.prompt_words:
        best, count = float("inf"), float(words)
        for _ in range(limits.repeats):
            t, lines = client.request("POST", "/tokenize", {"model": model, "prompt": WORD * words})
            try:
                answer = json.loads(b"".join(line for _, line in lines) or b"{}")
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                raise InputError(f"POST /tokenize answered 200 with something that is not a JSON object: "
                                 f"{b''.join(line for _, line in lines)[:80]!r}", field="--base-url",
                                 allowed="a server with vLLM's /tokenize endpoint")
            count = float(answer.get("count", len(answer.get("tokens", ())) or words))
            best = min(best, t)
        counts.append(count)
        times.append(best)
    return counts, times


def _completion(client: _Client, model: str, max_tokens: int) -> tuple[float, list[float]]:
    """A streamed completion: (seconds to the full response, seconds to each data chunk)."""
    body = {"model": model, "prompt": WORD * 8, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True}
    total, lines = client.request("POST", "/v1/completions", body)
    chunks = [t for t, line in lines if line.startswith(b"data:") and line != b"data: [DONE]"]
    return total, chunks


class _Background:
    """N streaming completions held open (each read on its own thread, so the server never blocks
    on a full socket) until closed; the server aborts them when their connections close."""

    def __init__(self, client: _Client, model: str, num_streams: int, max_tokens: int):
        self._conns: list[http.client.HTTPConnection] = []
        # Each connection's socket, held here: http.client hands it to the response (the connection
        # forgets it), and shutting it down is what wakes a reader blocked on the stream.
        self._socks: list[socket.socket] = []
        self._started = [threading.Event() for _ in range(num_streams)]
        self._threads = []
        body = json.dumps({"model": model, "prompt": WORD * 8, "max_tokens": max_tokens, "ignore_eos": True,
                           "temperature": 0.0, "stream": True}).encode()
        for started in self._started:
            conn = client.connection()
            try:
                conn.connect()
            except OSError as exc:
                self.close()
                raise InputError(f"a background stream: {exc}", field="--base-url",
                                 allowed="a reachable OpenAI-compatible server") from None
            self._conns.append(conn)
            self._socks.append(conn.sock)
            thread = threading.Thread(target=self._read, args=(conn, client.prefix, body, started), daemon=True)
            thread.start()
            self._threads.append(thread)

    @staticmethod
    def _read(conn: http.client.HTTPConnection, prefix: str, body: bytes, started: threading.Event) -> None:
        try:
            conn.request("POST", prefix + "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            while line := resp.readline(MAX_LINE_BYTES):  # bounded lines; each one is dropped
                if line.startswith(b"data:"):
                    started.set()
        except (OSError, http.client.HTTPException, ValueError):
            pass  # closed by close(), or the server ended the stream
        finally:
            started.set()

    def wait_streaming(self, timeout_s: float) -> bool:
        """Every stream has its first chunk (they are running in the engine) within timeout_s."""
        stop = time.monotonic() + timeout_s
        return all(ev.wait(max(stop - time.monotonic(), 0.0)) for ev in self._started)

    def close(self) -> None:
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for conn in self._conns:
            conn.close()
        for thread in self._threads:
            thread.join(timeout=5.0)


def stream_counts(limits: ProbeLimits) -> tuple[int, ...]:
    """The background stream counts the per-stream probe uses: STREAM_COUNTS' leading ones that fit
    the request cap beside the other probes (at least two, or the cap is refused up front)."""
    budget = limits.max_requests - limits.repeats * (1 + len(limits.prompt_words))
    counts: list[int] = []
    for n in STREAM_COUNTS:
        cost = n + limits.repeats
        if cost > budget:
            break
        counts.append(n)
        budget -= cost
    if len(counts) < 2:
        need = limits.max_requests - budget + sum(n + limits.repeats for n in STREAM_COUNTS[len(counts):2])
        raise InputError(f"the probe needs at least {need} requests with these settings",
                         field="--max-requests", allowed=f"an integer >= {need}")
    return tuple(counts)


def _per_stream_probe(client: _Client, model: str, limits: ProbeLimits) -> tuple[list[float], list[float]]:
    """(open background streams, fastest first-chunk time of a 1-token streamed request) per count."""
    counts, firsts = [], []
    for n in stream_counts(limits):
        background = _Background(client, model, n, BACKGROUND_TOKENS) if n else None
        try:
            if background is not None and not background.wait_streaming(limits.request_timeout_s):
                raise InputError(f"{n} background streams did not all start within {limits.request_timeout_s:g} s",
                                 field="--timeout-s", allowed="a longer timeout, or a server with room for them")
            best = float("inf")
            for _ in range(limits.repeats):
                _, chunks = _completion(client, model, 1)
                if chunks:
                    best = min(best, chunks[0])
        finally:
            if background is not None:
                background.close()
        if best < float("inf"):
            counts.append(float(n))
            firsts.append(best)
    return counts, firsts


def probe_frontend(base_url: str, model: str, limits: ProbeLimits | None = None,
                   engine_step_s: float = 0.0) -> FrontendMeasurement:
    """Measure the frontend of the server at base_url (bounded; see the module docstring)."""
    limits = limits or ProbeLimits()
    stream_counts(limits)  # refuse a cap too small for the whole probe before sending anything
    client = _Client(base_url, limits)
    rtt = [client.request("GET", "/v1/models")[0] for _ in range(limits.repeats)]
    http_s = min(rtt)
    counts, tok_times = _tokenize_probe(client, model, limits)
    base, per_token = _fit_line(counts, tok_times)
    per_token = max(per_token, 0.0)
    tokenize_base_s = max(base - http_s, 0.0)
    open_streams, first = _per_stream_probe(client, model, limits)
    if len(open_streams) < 2:
        raise InputError("the streamed completions returned no chunks", field="--base-url",
                         allowed="a server that streams /v1/completions (stream: true)")
    # first chunk(N) = http + tokenize + hop + engine step + hop + the step's output pass over N + 1
    # requests: the slope on N is the per-request output cost; what the intercept leaves is two hops.
    alone_s, per_request = _fit_line(open_streams, first)
    per_request = max(per_request, 0.0)
    step_out_s = FrontendConfig().output_step_s  # not separable from the hops from a client: the default
    residual = (alone_s - http_s - tokenize_base_s - per_token * PROBE_PROMPT_TOKENS - engine_step_s
                - step_out_s - per_request)
    cfg = FrontendConfig(enabled=True, http_s=http_s, tokenize_base_s=tokenize_base_s, tokenize_s_per_token=per_token,
                         engine_hop_s=max(residual, 0.0) / 2, output_step_s=step_out_s,
                         output_per_request_s=per_request)
    return FrontendMeasurement(cfg, client.count, {"models_rtt_s": rtt, "tokenize_s": tok_times,
                                                   "tokenize_tokens": counts, "open_streams": open_streams,
                                                   "first_chunk_s": first})
