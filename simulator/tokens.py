"""The one deterministic token source every executor uses (simulated or GPU).

Output token k of a request is the vLLM oracle's rule, oracle_token(req_id, k), so the scheduler sees
the same tokens (and the same prefix-cache block hashes) in every mode. Speculative decoding uses a
seeded per-position acceptance model: draft position i of the step that produces output k is accepted
when u(seed, req_id, k, i) < acceptance[i] and every earlier position was accepted. u is a pure hash,
so the outcome does not depend on the order in which executors ask.
"""

from __future__ import annotations

import zlib

from scheduler.steptrace import oracle_token


def _uniform(seed: int, req_id: str, k: int, i: int) -> float:
    return zlib.crc32(f"{seed}:{req_id}:{k}:{i}".encode()) / 2**32


class TokenSource:
    def __init__(self, seed: int = 0, acceptance: tuple[float, ...] = ()) -> None:
        self.seed = seed
        self.acceptance = acceptance

    def token(self, req_id: str, k: int) -> int:
        return oracle_token(req_id, k)

    def num_accepted(self, req_id: str, k: int, num_drafts: int) -> int:
        """Accepted drafts (a prefix) when the step's first new output is the request's k-th."""
        n = 0
        for i in range(min(num_drafts, len(self.acceptance))):
            if _uniform(self.seed, req_id, k, i) >= self.acceptance[i]:
                break
            n += 1
        return n

    def drafts(self, req_id: str, k: int, num_spec_tokens: int) -> list[int]:
        """Draft tokens proposed after output k-1: the tokens the target will produce if accepted."""
        return [oracle_token(req_id, k + i) for i in range(num_spec_tokens)]
