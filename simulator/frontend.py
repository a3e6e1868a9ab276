"""The OpenAI-compatible frontend a benchmark client talks to (off for in-process runs).

A request measured over HTTP passes through vLLM's API server before the engine sees it, and every
output chunk passes through it again on the way back:

    client send --(http_s)--> API server --(tokenize)--> --(engine_hop_s)--> EngineCore.add_request
    EngineCore output --(engine_hop_s)--> detokenize + SSE write (chunk_s) --> client

The API server is one asyncio event loop: request handling and tokenization of different requests do
not overlap (`serial: true`), so a burst of long prompts queues in front of the engine. Output-side
work (hop back, detokenize, SSE) runs while the engine computes the next step, so it shifts every
chunk the client sees by a constant and does not slow the engine.

Nothing here touches the scheduler: `simulator/client.py` passes each sent request through the
event loop (`request_service_s`) and the hop, and the engine delays every output the client sees
by `output_delay_s`. The defaults are order-of-magnitude figures (see docs/FRONTEND.md for their sources); for numbers that
match a particular server, measure it with `servesim calibrate-frontend`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.traces.errors import InputError


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
