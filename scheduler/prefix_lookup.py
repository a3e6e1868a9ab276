"""Read-only prefix-cache lookups of the vLLM scheduler, for routers: how much of a prompt the GPU
prefix cache holds now, and how much more the KV connector's CPU tier holds past it.

Both build a throwaway Request with the scheduler's own block hasher, so the block hashes are
exactly those the request itself will carry (LoRA keys, block size and provenance included), and
ask the structures the scheduler asks at admission without changing them: the KV cache
coordinator's `find_longest_cache_hit` (no LRU touch, no stats) and the connector's
`peek_num_matched_tokens` (the OffloadingConnector's manager `lookup`, no `touch`). SGLang's
page-keyed radix tree reads its keys from the same probes (`shared_probe`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.request import BlockHasher, Request, SamplingParams

if TYPE_CHECKING:
    from servesim.scheduler.hashing import TokenProvenance
    from servesim.scheduler.kv.coordinator import BlocksByGroup
    from servesim.scheduler.scheduler import Scheduler

PROBE_ID = "cached_prefix_tokens"  # the throwaway request's id (never added to the scheduler)


def probe_request(block_hasher: BlockHasher | None, token_ids: Sequence[int], lora_id: int | None,
                  provenance: TokenProvenance | None, num_tokens: int | None = None) -> Request:
    """A request over the first num_tokens of `token_ids` (all by default) carrying the block
    hashes a scheduler keying blocks with `block_hasher` would give it. Keyed by `provenance`,
    its ids are left unbuilt until read (a lookup reads its keys alone)."""
    n = len(token_ids) if num_tokens is None else num_tokens
    if provenance is None:
        return Request(PROBE_ID, list(token_ids[:n]), SamplingParams(max_tokens=1), lora_id=lora_id,
                       block_hasher=block_hasher)
    return Request(PROBE_ID, LazyTokenIds(n, lambda: token_ids[:n]), SamplingParams(max_tokens=1),
                   lora_id=lora_id, block_hasher=block_hasher, token_provenance=provenance.head(n))


class ProbeKeys:
    """What a scheduler's probes depend on besides the prompt, read from its configuration once
    (a router reads every replica at every decision): its block hasher, block size and hash
    algorithm, and whether a growing head of a prompt may be looked up (gpu_prefix_hit)."""

    __slots__ = ("block_hasher", "block_size", "hash_algo", "growing")

    def __init__(self, block_hasher: BlockHasher, block_size: int, hash_algo: str, growing: bool) -> None:
        self.block_hasher = block_hasher
        self.block_size = block_size
        self.hash_algo = hash_algo
        self.growing = growing


def _immutable(token_ids: object) -> bool:
    """Whether the ids cannot change while they are asked about (a tuple, LazyTokenIds). A
    function, not a condition in place: the compiled build would narrow the ids to a tuple after it."""
    kind = type(token_ids)
    return kind is tuple or kind is LazyTokenIds


class _SharedProbes:
    """The probes of the last prompt looked up, shared by every scheduler that keys blocks alike.

    A router asks each replica in turn about one prompt (the same `token_ids` tuple or LazyTokenIds:
    only those are shared, whose ids cannot change between the questions). A probe is
    never changed by a lookup (note_lookup reads its key root, find_longest_cache_hit its hashes),
    and its hashes are a function of the ids, the block size, the hash algorithm, the LoRA id and
    the prompt's provenance alone (Request's block hasher or provenance keys; a probe carries no
    salt and no multimodal item): schedulers equal in those get the same hashes from one probe.
    Holds the prompt, so its identity cannot be reused by another object while it is the key.
    The last probe handed out is checked first, field by field: replicas configured alike ask
    for it in turn, and the dict's tuple key costs more to build and hash than the comparison."""

    __slots__ = ("token_ids", "probes", "last", "last_n", "last_block_size", "last_hash_algo", "last_lora_id",
                 "last_prompt")

    def __init__(self) -> None:
        self.token_ids: Sequence[int] | None = None
        # by (head length, block size, hash algorithm, LoRA id, id of the provenance's prompt
        # segments): (those segments, the probe); identity, not equality, is what is compared (the
        # replicas share one segments tuple: simulator/request_factory.py), kept alive by the entry
        self.probes: dict[tuple, tuple[object, Request]] = {}
        self.last: Request | None = None  # of token_ids, with the fields below (kept alive by probes)
        self.last_n = 0
        self.last_block_size = 0
        self.last_hash_algo = ""
        self.last_lora_id: int | None = None
        self.last_prompt: object = None

    def probe(self, block_hasher: BlockHasher, block_size: int, hash_algo: str, token_ids: Sequence[int],
              n_tokens: int, lora_id: int | None, provenance: TokenProvenance | None) -> Request:
        """probe_request(block_hasher, token_ids[:n_tokens], lora_id, provenance) (`block_size`,
        `hash_algo`: the hasher's), or its equal made for another scheduler of this prompt."""
        if not _immutable(token_ids):
            return probe_request(block_hasher, token_ids, lora_id, provenance, n_tokens)
        prompt = None if provenance is None else provenance.prompt
        last = self.last
        if token_ids is self.token_ids:
            if (last is not None and n_tokens == self.last_n and block_size == self.last_block_size
                    and prompt is self.last_prompt and lora_id == self.last_lora_id
                    and hash_algo == self.last_hash_algo):
                return last
        else:
            self.token_ids = token_ids
            self.probes = {}
        key = (n_tokens, block_size, hash_algo, lora_id, id(prompt))
        entry = self.probes.get(key)
        if entry is not None and entry[0] is prompt:
            req = entry[1]
        else:
            req = probe_request(block_hasher, token_ids, lora_id, provenance, n_tokens)
            self.probes[key] = (prompt, req)
        self.last, self.last_n, self.last_block_size, self.last_hash_algo = req, n_tokens, block_size, hash_algo
        self.last_lora_id, self.last_prompt = lora_id, prompt
        return req


_SHARED = _SharedProbes()


def shared_probe(block_hasher: BlockHasher, block_size: int, hash_algo: str, token_ids: Sequence[int],
                 n_tokens: int, lora_id: int | None, provenance: TokenProvenance | None) -> Request:
    """A probe of the prompt's first n_tokens (probe_request), shared by every scheduler that
    keys blocks alike while the router asks about one prompt (_SharedProbes)."""
    return _SHARED.probe(block_hasher, block_size, hash_algo, token_ids, n_tokens, lora_id, provenance)


def gpu_cached_prefix_tokens(sched: Scheduler, token_ids: Sequence[int], lora_id: int | None,
                             provenance: TokenProvenance | None) -> int:
    """Leading prompt tokens get_computed_blocks would hit now: whole blocks, capped at
    len(token_ids) - 1 (gpu_prefix_hit)."""
    return gpu_prefix_hit(sched, token_ids, lora_id, provenance)[1]


def gpu_prefix_hit(sched: Scheduler, token_ids: Sequence[int], lora_id: int | None,
                   provenance: TokenProvenance | None) -> tuple[BlocksByGroup, int, Request | None]:
    """(the hit blocks of each KV group, the hit in tokens, the probe last looked up) of
    gpu_cached_prefix_tokens; the probe is None when nothing was looked up (caching off, a prompt
    under two tokens). With full attention only, hash a growing head of the prompt (8, 32, 128,
    ... blocks) and stop at the first head with a miss: hashing a long prompt costs more than the
    lookups. The probe then holds the hash of the first block missed, if the prompt reaches past
    it (a fast-path reader compares it with blocks a pending run caches: fastpath/planned_reads.py)."""
    keys = sched.probe_keys
    kvm = sched.kv_cache_manager
    if keys is None or not kvm.enable_caching or len(token_ids) < 2:
        return (), 0, None
    max_hit = len(token_ids) - 1
    block_size = keys.block_size
    n_tokens = 8 * block_size if keys.growing else len(token_ids)
    while True:
        n_head = min(n_tokens, len(token_ids))
        req = _SHARED.probe(keys.block_hasher, block_size, keys.hash_algo, token_ids, n_head, lora_id, provenance)
        kvm.note_lookup(req)  # a private block it could hit is published first
        blocks, hit = kvm.coordinator.find_longest_cache_hit(req.block_hashes, min(max_hit, n_head))
        if n_head == len(token_ids) or hit < n_head // block_size * block_size:
            return blocks, hit, req
        n_tokens *= 4


def cpu_cached_prefix_tokens(sched: Scheduler, token_ids: Sequence[int], lora_id: int | None,
                             provenance: TokenProvenance | None, num_gpu_cached_tokens: int) -> int:
    """Prompt tokens past the first num_gpu_cached_tokens that the connector's tier would load
    (0 without a connector, or without prefix caching: offload blocks are named by block hashes).
    The whole prompt is hashed: the tier's lookup runs from the GPU hit to the first miss."""
    connector = sched.connector
    if connector is None or not sched.kv_cache_manager.enable_caching or len(token_ids) < 2:
        return 0
    req = probe_request(sched.block_hasher, token_ids, lora_id, provenance)
    return connector.peek_num_matched_tokens(req, num_gpu_cached_tokens)
