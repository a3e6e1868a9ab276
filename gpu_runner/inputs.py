"""Step inputs from a SchedulerOutput, following vLLM V1's persistent batch.

The batch keeps, per request, its token ids and block table. New requests bring their prompt and
blocks; cached requests bring deltas (resumed requests replace their block table, others append);
finished and preempted requests leave. Each step flattens the scheduled tokens of every request in
the scheduler's order into input ids, positions, a slot mapping and the attention metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servesim.gpu_runner.ops.metadata import AttentionMetadata
from servesim.scheduler.output import SchedulerOutput


@dataclass(slots=True)
class CachedState:
    token_ids: list[int]  # prompt + sampled outputs the worker knows
    block_ids: list[int]  # KV group 0 block table


@dataclass(slots=True)
class StepInputs:
    req_ids: list[str]
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [S] int64: row of each request's last scheduled token


class PersistentBatch:
    def __init__(self, block_size: int, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size  # trace token ids are folded into the model's vocabulary
        self.device = device
        self.requests: dict[str, CachedState] = {}

    def update(self, so: SchedulerOutput) -> None:
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.requests.pop(rid, None)  # comes back as a resumed request with a fresh block table
        for nr in so.scheduled_new_reqs:
            self.requests[nr.req_id] = CachedState(list(nr.prompt_token_ids), list(nr.block_ids[0]))
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[i]
            state = self.requests.get(rid)
            if rid in cached.resumed_req_ids or state is None:
                tokens = cached.all_token_ids.get(rid, state.token_ids if state else [])
                self.requests[rid] = CachedState(list(tokens), list(new_blocks[0]) if new_blocks else [])
            elif new_blocks is not None:
                state.block_ids.extend(new_blocks[0])

    def append_tokens(self, req_id: str, tokens: list[int]) -> None:
        self.requests[req_id].token_ids.extend(tokens)

    def build(self, so: SchedulerOutput, computed: list[int]) -> StepInputs:
        """Flatten the step. computed[i]: num_computed_tokens of request i before the step."""
        req_ids = list(so.num_scheduled_tokens)
        bs = self.block_size
        ids, pos, slots, qsl, seq_lens = [], [], [], [0], []
        max_blocks = max((len(self.requests[r].block_ids) for r in req_ids), default=1)
        table = torch.zeros((len(req_ids), max(max_blocks, 1)), dtype=torch.int32)
        for i, rid in enumerate(req_ids):
            st = self.requests[rid]
            n, c = so.num_scheduled_tokens[rid], computed[i]
            known = st.token_ids[c:c + n]
            drafts = so.scheduled_spec_decode_tokens.get(rid, [])
            toks = known + list(drafts)[: n - len(known)]
            if len(toks) < n:
                raise RuntimeError(f"{rid}: {n} tokens scheduled but only {len(toks)} known at position {c}")
            ids.extend(t % self.vocab_size for t in toks)
            for p in range(c, c + n):
                pos.append(p)
                slots.append(st.block_ids[p // bs] * bs + p % bs)
            qsl.append(qsl[-1] + n)
            seq_lens.append(c + n)
            table[i, : len(st.block_ids)] = torch.tensor(st.block_ids, dtype=torch.int32)
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_table=table.to(dev),
            max_query_len=max((q1 - q0 for q0, q1 in zip(qsl, qsl[1:])), default=0),
            max_seq_len=max(seq_lens, default=0),
        )
        last = torch.tensor([q - 1 for q in qsl[1:]], dtype=torch.int64, device=dev)
        return StepInputs(req_ids, torch.tensor(ids, dtype=torch.int64, device=dev),
                          torch.tensor(pos, dtype=torch.int64, device=dev), attn, last)
