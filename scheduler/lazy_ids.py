"""Token ids built only when something reads them.

The simulated engine reads a request's ids rarely: it counts them, keys their KV blocks from their
provenance (block_keys.py) and applies no stop token inside a run (decode_run_horizon). So:

- a synthetic prompt's ids stay unbuilt until read (LazyTokenIds: the engine reads their count);
- a run of plain decode steps (simulator/macro_step.py) samples k ids for each request of its
  batch, ~4 M on the Azure conversation hour, each a position of the request's output id stream
  (the token source: scheduler/worker.py, the vLLM oracle's rule). The run hands over, per
  request, only where its ids start in that stream and how many there are (RunTokens), and the
  request stores them unbuilt (Request.append_output_tokens_from). Whoever reads a request's
  ids (a resumed request's copy, a real-id hasher, SGLang's radix tree, a stop rule, a test)
  gets them built: the very ids stepping would have appended. Building every id of every run
  cost ~8 % of the hour.

Built ids are stored compactly (compact_ids): an int32 array while they fit.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol


class LazyTokenIds:
    """A prompt's ids, built on first read. A synthetic prompt's ids are a pure function of its
    trace row, and the simulated engine reads only their count (its prefix-cache keys come from
    the ids' provenance, block_keys.py), so most prompts never need them built; a reader that does
    (the GPU runner, a real-id hasher, a resumed request's output data) gets exactly the ids.
    A prefix-aware router asks every replica about one (scheduler/prefix_lookup.py): a lookup
    keyed by provenance reads its length alone."""

    __slots__ = ("num_tokens", "_build", "_ids")

    def __init__(self, num_tokens: int, build: Callable[[], Sequence[int]]) -> None:
        if num_tokens < 1:
            raise ValueError(f"a prompt needs at least one token, got {num_tokens}")
        self.num_tokens = num_tokens
        self._build = build
        self._ids: array | list[int] | None = None

    def ids(self) -> array | list[int]:
        """The ids (compact, as Request stores them), built on the first call."""
        if self._ids is None:
            ids = compact_ids(self._build())
            if len(ids) != self.num_tokens:  # the builder's contract: exactly num_tokens ids
                raise ValueError(f"lazy prompt built {len(ids)} ids, declared {self.num_tokens}")
            self._ids = ids
        return self._ids

    def __len__(self) -> int:
        return self.num_tokens

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __getitem__(self, index: Any) -> Any:  # an int or a slice, as the built ids answer
        return self.ids()[index]


class OutputIdSource(Protocol):
    """Where output ids come from: position k of a request's stream is its k-th sampled id."""

    def tokens(self, req_id: str, k: int, n: int) -> list[int]:
        """Ids k .. k + n - 1 of req_id's stream (exactly n of them)."""
        ...

    def tokens_at(self, req_ids: list[str], positions: list[int]) -> list[int]:
        """Id positions[i] of req_ids[i]'s stream, for each i (one id of each of several streams:
        a step of a run's batch, in one call)."""
        ...


class RunTokens:
    """Per request of a run's batch (in batch order): request i samples ids first[i] ..
    first[i] + counts[i] - 1 of source's stream for req_ids[i], one a step, in step order."""

    __slots__ = ("source", "req_ids", "first", "counts")

    def __init__(self, source: OutputIdSource, req_ids: list[str], first: list[int], counts: list[int]) -> None:
        self.source = source
        self.req_ids = req_ids
        self.first = first
        self.counts = counts

    @staticmethod
    def of_lists(req_ids: list[str], token_ids: list[list[int]]) -> RunTokens:
        """Explicit ids (token_ids[i]: request i's, in step order), e.g. a test's own."""
        return RunTokens(_Lists(dict(zip(req_ids, token_ids))), req_ids, [0] * len(req_ids),
                         [len(t) for t in token_ids])

    def token(self, i: int, j: int) -> int:
        """Request i's id sampled at the run's step j (0-based; j < counts[i])."""
        return self.at_step(j, [i])[0]

    def at_step(self, j: int, rows: list[int] | None = None) -> list[int]:
        """The ids sampled at the run's step j by requests `rows` (indices; default every one, in
        batch order): e.g. the run's last step, left in flight with its tokens built."""
        counts, first, req_ids = self.counts, self.first, self.req_ids
        ids: list[str] = []
        positions: list[int] = []
        for i in (range(len(req_ids)) if rows is None else rows):
            if not 0 <= j < counts[i]:
                raise IndexError(f"{req_ids[i]}: step {j} of a run that samples {counts[i]} ids for it")
            ids.append(req_ids[i])
            positions.append(first[i] + j)
        return self.source.tokens_at(ids, positions)

    def ids(self, i: int, n: int) -> list[int]:
        """Request i's first n ids of the run, built (n <= counts[i])."""
        if n > self.counts[i]:
            raise IndexError(f"{self.req_ids[i]}: {n} ids of a run that samples {self.counts[i]} for it")
        return self.source.tokens(self.req_ids[i], self.first[i], n)


class _Lists:
    """An OutputIdSource over explicit lists: position k of a request's stream is its list's k-th."""

    __slots__ = ("by_id",)

    def __init__(self, by_id: dict[str, list[int]]) -> None:
        self.by_id = by_id

    def tokens(self, req_id: str, k: int, n: int) -> list[int]:
        ids = self.by_id[req_id][k:k + n]
        if len(ids) != n:
            raise IndexError(f"{req_id}: ids {k}..{k + n - 1} asked of a list of {len(self.by_id[req_id])}")
        return ids

    def tokens_at(self, req_ids: list[str], positions: list[int]) -> list[int]:
        return [self.tokens(r, k, 1)[0] for r, k in zip(req_ids, positions)]


def compact_ids(token_ids: Sequence[int]) -> array | list[int]:
    """token_ids as a new array('i') (int32), array('q') when an id needs 64 bits, or a list when
    one does not fit in int64 (or is not an int). int32 is also the hashing's canonical encoding
    (scheduler/hashing.py), so the narrowest storage that fits is always chosen."""
    if type(token_ids) is array and token_ids.typecode == "i":
        return token_ids[:]  # a copy in one memcpy
    for typecode in "iq":
        try:
            return array(typecode, token_ids)
        except OverflowError:
            continue
        except TypeError:
            break
    return list(token_ids)
