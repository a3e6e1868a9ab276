"""The inner loop's share of a parametrized family.

`make test-fast` (the inner loop, ~2 minutes) runs the tests not marked slow; `make test` and CI
run them all. A differential family with many cases keeps a few representative ones in the inner
loop and marks the rest slow with these helpers, so a change that breaks the family is usually seen
in the inner loop and always in `make test`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest


def share(values: Iterable, inner: Sequence[int], ids: Sequence[str] | None = None) -> list:
    """`values` as parametrize arguments, those at the positions in `inner` in the inner loop and
    the others marked slow. A tuple value is a row of several arguments."""
    out = []
    for i, v in enumerate(values):
        marks = () if i in inner else (pytest.mark.slow,)
        args = v if isinstance(v, tuple) else (v,)
        out.append(pytest.param(*args, marks=marks, id=None if ids is None else ids[i]))
    return out


def slow_unless(values: Iterable, inner: Iterable) -> list:
    """`values` as parametrize arguments, those in `inner` in the inner loop, the others slow."""
    keep = set(inner)
    vals = list(values)
    return share(vals, [i for i, v in enumerate(vals) if v in keep])
