"""The OpenAI-compatible frontend a benchmark client talks to (off for in-process runs).

A request measured over HTTP passes through vLLM's API server before the engine sees it, and every
output chunk passes through it again on the way back:

    client send --(http_s)--> API server --(tokenize)--> --(engine_hop_s)--> EngineCore.add_request
    EngineCore output --(engine_hop_s)--> detokenize + SSE write (chunk_s) --> client

The API server is one asyncio event loop: request handling and tokenization of different requests do
not overlap (`serial: true`), so a burst of long prompts queues in front of the engine. Output-side
work (hop back, detokenize, SSE) runs while the engine computes the next step, so it shifts every
chunk the client sees by a constant and does not slow the engine.

Nothing here touches the scheduler: the frontend turns client send times into engine arrival times
(`engine_arrivals`) and engine output times into client receive times (`output_delay_s`). The
defaults are order-of-magnitude figures (see docs/FRONTEND.md for their sources); for numbers that
match a particular server, measure it with `servesim calibrate-frontend`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from traces.errors import InputError


@dataclass(slots=True)
class FrontendConfig:
    enabled: bool = False  # model the API server (runs measured by an HTTP benchmark client)
    http_s: float = 0.001  # per request: HTTP parse, validation, routing (s)
    tokenize_base_s: float = 0.0002  # per request: tokenizer call overhead (s)
    tokenize_s_per_token: float = 1.0e-6  # per prompt token (s)
    engine_hop_s: float = 0.0005  # API server <-> EngineCore, each way (s)
    chunk_s: float = 0.0003  # per streamed chunk: detokenize + SSE write (s)
    serial: bool = True  # request handling + tokenization run on one event loop, one at a time

    def __post_init__(self) -> None:
        for name in ("http_s", "tokenize_base_s", "tokenize_s_per_token", "engine_hop_s", "chunk_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InputError(f"got {value!r}", field=f"frontend.{name}", allowed="a finite number >= 0 (s)")

    def request_service_s(self, prompt_len: int) -> float:
        """Event-loop time one request takes before it is handed to the engine (s)."""
        return self.http_s + self.tokenize_base_s + self.tokenize_s_per_token * prompt_len

    def output_delay_s(self) -> float:
        """Engine output -> the client receives the chunk (s); the same for every chunk."""
        return self.engine_hop_s + self.chunk_s


def engine_arrivals(cfg: FrontendConfig, send_s: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
    """Engine arrival time of each request, given client send times sorted ascending (s).

    With `serial`, the API server is a single FIFO server: request i starts being handled at
    max(send_i, done_{i-1}). Without it, each request is handled independently.
    """
    # send_s, prompt_len: [num_requests]
    service = cfg.http_s + cfg.tokenize_base_s + cfg.tokenize_s_per_token * prompt_len.astype(np.float64)
    if not cfg.serial:
        return send_s + service + cfg.engine_hop_s
    done = np.empty_like(send_s, dtype=np.float64)
    free_at = -math.inf
    # A Lindley recursion: sequential by nature, but a plain float loop (~0.1 us per request).
    for i, (t, s) in enumerate(zip(send_s.tolist(), service.tolist())):
        free_at = (t if t > free_at else free_at) + s
        done[i] = free_at
    return done + cfg.engine_hop_s
