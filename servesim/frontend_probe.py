"""Measure an OpenAI-compatible server's frontend costs (`servesim calibrate-frontend`).

Three bounded probes, each separating one cost of `simulator.frontend.FrontendConfig`:

1. `GET /v1/models`: a round trip that does no model work -> `http_s`.
2. `POST /tokenize` with prompts of growing length: time = a + b * tokens, least squares ->
   `tokenize_s_per_token` = b, `tokenize_base_s` = max(a - http_s, 0).
3. The same completion streamed and not streamed: streaming adds one detokenize + SSE write per
   chunk, so `chunk_s` = (E2E_stream - E2E_plain) / chunks, floored at 0. The time to the
   first chunk of a 1-token request, minus HTTP, tokenization and one engine step
   (`engine_step_s`, from the cost model or 0), is two hops: `engine_hop_s` is half of it. With
   `engine_step_s` = 0 the hop is an upper bound (the step is folded into it).

Every request has a timeout, the number of requests is capped and the probe stops at a deadline:
it never floods a server. It talks only to the base URL it is given. Each figure is the fastest of
`repeats` tries: noise on a busy client or server only ever adds time, so the minimum is the least
disturbed observation of a fixed cost.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from servesim.simulator.frontend import FrontendConfig
from servesim.traces.errors import InputError

WORD = "hello "  # a word most BPE tokenizers map to one token


@dataclass(slots=True)
class ProbeLimits:
    max_requests: int = 60  # HTTP requests in all
    request_timeout_s: float = 30.0
    deadline_s: float = 120.0  # whole probe
    prompt_words: tuple[int, ...] = (16, 256, 1024, 2048)  # tokenize probe sizes
    output_tokens: int = 32  # streamed vs plain completion length
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.max_requests < 10:
            raise InputError(f"got {self.max_requests}", field="--max-requests", allowed="an integer >= 10")
        if self.request_timeout_s <= 0 or self.deadline_s <= 0:
            raise InputError("timeouts must be > 0", field="--timeout-s")


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

    def _conn(self) -> http.client.HTTPConnection:
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
        conn = self._conn()
        try:
            t0 = time.perf_counter()
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, self.prefix + path, payload, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise InputError(f"{method} {path} answered HTTP {resp.status}: {resp.read(200)!r}",
                                 field="--base-url", allowed="an OpenAI-compatible server (vLLM, SGLang, ...)")
            lines = []
            for line in resp:
                lines.append((time.perf_counter() - t0, line.strip()))
            return time.perf_counter() - t0, lines
        except OSError as exc:
            raise InputError(f"{method} {path}: {exc}", field="--base-url",
                             allowed="a reachable OpenAI-compatible server") from None
        finally:
            conn.close()


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
            answer = json.loads(b"".join(line for _, line in lines) or b"{}")
            count = float(answer.get("count", len(answer.get("tokens", ())) or words))
            best = min(best, t)
        counts.append(count)
        times.append(best)
    return counts, times


def _completion(client: _Client, model: str, stream: bool, max_tokens: int) -> tuple[float, list[float]]:
    body = {"model": model, "prompt": WORD * 8, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": stream}
    total, lines = client.request("POST", "/v1/completions", body)
    chunks = [t for t, line in lines if line.startswith(b"data:") and line != b"data: [DONE]"]
    return total, chunks


def probe_frontend(base_url: str, model: str, limits: ProbeLimits | None = None,
                   engine_step_s: float = 0.0) -> FrontendMeasurement:
    """Measure the frontend of the server at base_url (bounded; see the module docstring)."""
    limits = limits or ProbeLimits()
    client = _Client(base_url, limits)
    rtt = [client.request("GET", "/v1/models")[0] for _ in range(limits.repeats)]
    http_s = min(rtt)
    counts, tok_times = _tokenize_probe(client, model, limits)
    base, per_token = _fit_line(counts, tok_times)
    plain, streamed, first, num_chunks = [], [], [], 1
    for _ in range(limits.repeats):
        plain.append(_completion(client, model, False, limits.output_tokens)[0])
        total, chunks = _completion(client, model, True, limits.output_tokens)
        streamed.append(total)
        num_chunks = max(len(chunks), 1)
        _, one = _completion(client, model, True, 1)
        if one:
            first.append(one[0])
    chunk_costs = [max(min(streamed) - min(plain), 0.0) / num_chunks]
    tokenize_base_s = max(base - http_s, 0.0)
    tiny_tokens = 8.0
    chunk_s = chunk_costs[0]
    # first chunk = http + tokenize + hop + engine step + hop + chunk: what is left is two hops.
    residual = 0.0
    if first:
        residual = (min(first) - http_s - tokenize_base_s - max(per_token, 0.0) * tiny_tokens
                    - engine_step_s - chunk_s)
    cfg = FrontendConfig(enabled=True, http_s=http_s, tokenize_base_s=tokenize_base_s,
                         tokenize_s_per_token=max(per_token, 0.0), engine_hop_s=max(residual, 0.0) / 2,
                         chunk_s=chunk_s)
    return FrontendMeasurement(cfg, client.count, {"models_rtt_s": rtt, "tokenize_s": tok_times,
                                                   "tokenize_tokens": counts, "plain_s": plain,
                                                   "streamed_s": streamed, "first_chunk_s": first})
