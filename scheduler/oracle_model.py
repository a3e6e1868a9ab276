"""The vLLM oracle's fake worker, re-stated: tokens, stop tokens, drafts, acceptance, remote KV.

The oracle (../shared/tools/vllm_oracle, fake_model.py and fake_connector.py) feeds the real vLLM
scheduler model outputs that are pure functions of request ids and positions, through zlib.crc32 of
short strings. `run_step_trace` feeds ours the same ones through this module, so any difference
between the two traces comes from the schedulers. The rules (k, n: 0-based output positions):

- token k: EOS (id 2) when crc(f"{rid}:stop:{k}") % 10**6 < eos_rate * 10**6, else a stop id
  (stop_token_ids[crc(f"{rid}:stopid:{k}") % len]) below (eos_rate + stop_rate) * 10**6, else
  1000 + crc(f"{rid}:{k}") % 40000 (steptrace.oracle_token).
- drafts proposed with n output tokens: ngram proposes crc(f"{rid}:ndraft:{n}") % (K+1) (none for a
  request that sampled nothing or reached max_model_len; capped at max_model_len - num_tokens),
  eagle / draft_model always K; the first crc(f"{rid}:accept:{n}") % (K+1) are the target tokens,
  the rest target + 1.
- verification (greedy rejection sampling): accept while a draft equals the target, emit the
  target at the first mismatch, append the bonus token when all were accepted.
- per-request workload decisions key on f"{seed}:{rid}" (u(s) = crc(s) / 2**32); they are read
  from the workload's fields here, so only the worker-side rules above are needed.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.output import KVConnectorOutput, SchedulerOutput
    from servesim.scheduler.request import Request

EOS_TOKEN_ID = 2  # OPT's EOS, the oracle model's


def crc(s: str) -> int:
    return zlib.crc32(s.encode())


def base_token(req_id: str, k: int) -> int:
    return 1000 + crc(f"{req_id}:{k}") % 40000


@dataclass(slots=True, frozen=True)
class OracleModel:
    """Target model, drafter and rejection sampler of the oracle's fake model runner."""

    eos_rate: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    stop_rate: float = 0.0
    num_spec_tokens: int = 0
    spec_method: str = "ngram"
    max_model_len: int = 2048

    def token(self, req_id: str, k: int) -> int:
        """The k-th output token the target model produces for req_id."""
        if self.eos_rate > 0 or (self.stop_rate > 0 and self.stop_token_ids):
            u = crc(f"{req_id}:stop:{k}") % 1_000_000
            eos_cut = round(self.eos_rate * 1_000_000)
            if u < eos_cut:
                return EOS_TOKEN_ID
            if self.stop_token_ids and u < eos_cut + round(self.stop_rate * 1_000_000):
                ids = self.stop_token_ids
                return ids[crc(f"{req_id}:stopid:{k}") % len(ids)]
        return base_token(req_id, k)

    def propose(self, req_id: str, n: int, num_tokens: int, sampled: bool) -> list[int]:
        """Drafts after a step in which req_id was in the batch (n: its output tokens now)."""
        k = self.num_spec_tokens
        if k == 0:
            return []
        if self.spec_method == "ngram":
            # A prompt-lookup drafter proposes nothing without a new token or at max_model_len.
            if not sampled or num_tokens >= self.max_model_len:
                return []
            length = min(crc(f"{req_id}:ndraft:{n}") % (k + 1), self.max_model_len - num_tokens)
        else:
            length = k  # eagle / draft model draft for the whole batch (partial prefills too)
        correct = crc(f"{req_id}:accept:{n}") % (k + 1)
        drafts = [self.token(req_id, n + j) for j in range(length)]
        return [t if j < correct else t + 1 for j, t in enumerate(drafts)]

    def verify(self, req_id: str, n: int, drafts: list[int]) -> list[int]:
        """Greedy rejection sampling at output position n: the accepted drafts plus one token."""
        out = []
        for j, d in enumerate(drafts):
            t = self.token(req_id, n + j)
            out.append(t)
            if d != t:
                return out
        out.append(self.token(req_id, n + len(drafts)))
        return out


@dataclass(slots=True)
class OracleConnector:
    """The oracle's decode-side connector (fake_connector.py, NixlConnector-like): a request tagged
    for remote prefill loads every prompt token beyond its local hit asynchronously, once."""

    remote: set[str]  # request ids still tagged do_remote_prefill
    started: dict[str, int] = field(default_factory=dict)  # loads started since take_started_loads

    def get_num_new_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> tuple[int, bool]:
        if request.request_id in self.remote:
            count = request.num_prompt_tokens - num_local_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        return 0  # the KV is on another instance: no tier of this one holds it

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if request.request_id in self.remote:
            if num_external_tokens > 0:
                self.started[request.request_id] = num_external_tokens
            self.remote.discard(request.request_id)  # one transfer per request

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return False, None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> None:
        return None  # the transfer is driven outside the step (no per-step worker metadata)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        pass

    def take_events(self) -> tuple[()]:
        return ()

    def take_started_loads(self) -> dict[str, int]:
        out, self.started = self.started, {}
        return out
