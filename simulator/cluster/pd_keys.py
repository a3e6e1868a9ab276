"""Which prefill-side Request lends a handed-over request its prompt keys (DecodeEngine.submit_handed_over).

Interpreted in both builds (once per hand-off, cheap): tests spy on it through this module."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.simulator.engine import Engine


def key_donor(prefill: Engine, decode: Engine, request_id: str) -> Request | None:
    """The prefill side's Request of a request handed over to `decode`, where the decode side's
    Request would build the very same key plan and prompt-block keys (Request.take_prompt_keys),
    else None (build them). The same spec reaches both sides but for output_len, so the prompt's
    provenance and extra keys (LoRA id) are the same; the keys are the same where both sides key by
    provenance (not by hashing ids), both hash blocks of one size, the prefill side keyed its
    Request with a plan (key_root: a hasher attached, blocks of more than one token; no multimodal
    input), and both executors name the same output id stream (a plan's last run). The prefill
    side keeps its finished Request until the decode side has read its KV (RemoteDecodeConnector)."""
    donor = prefill.scheduler.requests.get(request_id)
    if donor is None or donor.key_root is None:
        return None
    p_in, d_in = prefill.requests_in, decode.requests_in
    if not (p_in.keys_from_provenance and d_in.keys_from_provenance):
        return None
    if decode.scheduler.block_hasher is None or prefill.scheduler.block_size != decode.scheduler.block_size:
        return None
    if p_in.executor.output_token_source(request_id) != d_in.executor.output_token_source(request_id):
        return None
    return donor
