"""A workload's requests stored as columns (SpecColumns): a RequestSpec is built when read.

One RequestSpec object per request, held for the whole run, cost ~600 B a request (1 M requests:
~0.6 GB of RSS before the first arrival). Here every request's id, arrival time and lengths are
one entry of a list or an array('d'/'q'), and each other field is a column only if some request
sets it away from its default (a plain trace sets none of them). Reading an index or iterating
builds the RequestSpec from its columns: the engine's arrival loop holds one spec at a time, and
what the run keeps is the columns.

Specs are validated once, when they are first built (RequestSpec.__post_init__) before they go
into columns; a spec read back holds the very values that were validated, so it is not checked
again. A spec read back is equal (==) to the one stored, not the same object: nothing may key on
a spec's identity across two reads.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Any, overload

from servesim.traces.request_spec import RequestSpec

# The columns every request has, in RequestSpec's field order (its first four fields).
_DENSE = ("request_id", "arrival_time_s", "prompt_len", "output_len")
# Every other field, with its default: a column of these exists only once a request differs.
_SPARSE: tuple[tuple[str, Any], ...] = tuple(
    (f.name, f.default) for f in fields(RequestSpec) if f.name not in _DENSE)
if any(d is MISSING for _, d in _SPARSE) or tuple(f.name for f in fields(RequestSpec))[:4] != _DENSE:
    raise TypeError("SpecColumns expects RequestSpec's first four fields to be its only ones without a default")
_SPARSE_NAMES = tuple(name for name, _ in _SPARSE)
_SPARSE_DEFAULTS = tuple(d for _, d in _SPARSE)
_read_sparse = attrgetter(*_SPARSE_NAMES)


def _spec_builder():
    """_spec(values): a RequestSpec whose fields, in field order, are `values`, set without running
    __init__'s checks (a spec read back holds values validated when it was stored). Written from
    the field list, as dataclasses writes an __init__: one unpacking assignment, a slot store per
    field (a descriptor call per field cost ~4x as much, at every arrival of a run)."""
    targets = "".join(f"spec.{name}, " for name in (*_DENSE, *_SPARSE_NAMES))
    code = f"def _spec(values):\n    spec = new(RequestSpec)\n    {targets}= values\n    return spec\n"
    namespace = {"new": object.__new__, "RequestSpec": RequestSpec}
    exec(code, namespace)
    return namespace["_spec"]


_spec = _spec_builder()


class SpecColumns(Sequence[RequestSpec]):
    """A read-only sequence of RequestSpecs kept as columns (see the module docstring)."""

    __slots__ = ("request_ids", "arrival_times_s", "prompt_lens", "output_lens", "_sparse")

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.arrival_times_s = array("d")
        self.prompt_lens = array("q")
        self.output_lens = array("q")
        # field name -> one value per request; a field nobody sets has no column
        self._sparse: dict[str, list] = {}

    @classmethod
    def of(cls, specs: Iterable[RequestSpec]) -> SpecColumns:
        """The specs as columns; a SpecColumns is returned as it is (columns are never changed in
        place). An iterable is read once, so a generator's specs are never all alive at once."""
        if isinstance(specs, SpecColumns):
            return specs
        out = cls()
        for spec in specs:
            out.append(spec)
        return out

    def append(self, spec: RequestSpec) -> None:
        """Add spec at the end (for building the columns; a workload's are not changed after)."""
        if not isinstance(spec, RequestSpec):
            raise TypeError(f"a workload's requests are RequestSpecs, got {type(spec).__name__}")
        i = len(self.request_ids)
        self.request_ids.append(spec.request_id)
        self.arrival_times_s.append(spec.arrival_time_s)
        self.prompt_lens.append(spec.prompt_len)
        self.output_lens.append(spec.output_len)
        values = _read_sparse(spec)
        sparse = self._sparse
        if values == _SPARSE_DEFAULTS and not sparse:
            return  # the common case: a plain request in a plain workload
        for name, value, default in zip(_SPARSE_NAMES, values, _SPARSE_DEFAULTS):
            column = sparse.get(name)
            if column is not None:
                column.append(value)
            elif value is not default and value != default:
                sparse[name] = [default] * i + [value]

    # --- reading -------------------------------------------------------------------------------
    def column(self, name: str) -> Sequence | None:
        """Field `name` of every request, in order (read-only); None: every request has the
        field's default."""
        dense = {"request_id": self.request_ids, "arrival_time_s": self.arrival_times_s,
                 "prompt_len": self.prompt_lens, "output_len": self.output_lens}
        if name in dense:
            return dense[name]
        if name not in _SPARSE_NAMES:
            raise KeyError(f"RequestSpec has no field {name!r}")
        return self._sparse.get(name)

    def any_set(self, name: str) -> bool:
        """Whether some request sets field `name` away from its default (None, (), ...)."""
        return self.column(name) is not None if name in _DENSE else name in self._sparse

    def __len__(self) -> int:
        return len(self.request_ids)

    @overload
    def __getitem__(self, index: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestSpec]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):  # a list of specs, as a list's slice is (the caller may change it)
            return list(self.rows(index))
        i = range(len(self.request_ids))[index]  # IndexError and negative indices as a list's
        sparse = self._sparse
        return _spec((self.request_ids[i], self.arrival_times_s[i], self.prompt_lens[i], self.output_lens[i],
                      *(_SPARSE_DEFAULTS if not sparse else
                        [c[i] if (c := sparse.get(name)) is not None else d for name, d in _SPARSE])))

    def __iter__(self) -> Iterator[RequestSpec]:
        dense = zip(self.request_ids, self.arrival_times_s, self.prompt_lens, self.output_lens)
        if not self._sparse:
            for values in dense:
                yield _spec((*values, *_SPARSE_DEFAULTS))
            return
        columns = [self._sparse.get(name) for name in _SPARSE_NAMES]
        for i, values in enumerate(dense):
            yield _spec((*values, *[d if c is None else c[i] for c, d in zip(columns, _SPARSE_DEFAULTS)]))

    def rows(self, index: slice) -> SpecColumns:
        """The requests of a slice, as columns."""
        out = SpecColumns()
        out.request_ids = self.request_ids[index]
        out.arrival_times_s = self.arrival_times_s[index]
        out.prompt_lens = self.prompt_lens[index]
        out.output_lens = self.output_lens[index]
        out._sparse = {name: column[index] for name, column in self._sparse.items()}
        return out

    def with_arrival_times(self, times_s: Sequence[float]) -> SpecColumns:
        """The same requests at these arrival times (one per request; the other columns copied)."""
        if len(times_s) != len(self):
            raise ValueError(f"{len(times_s)} arrival times for {len(self)} requests")
        out = self.rows(slice(None))
        out.arrival_times_s = array("d", times_s)
        return out

    def __add__(self, other: Iterable[RequestSpec]) -> list[RequestSpec]:
        return [*self, *other]  # a list, as a list's sum is

    def __radd__(self, other: Iterable[RequestSpec]) -> list[RequestSpec]:
        return [*other, *self]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  (equal to a list of the same specs)

    def __repr__(self) -> str:
        return f"SpecColumns({len(self)} requests)"

