"""A generated workload's tenants and SLO classes (`mix:` in a synthetic workload).

    mix:                                     # one arrival stream, split by fraction
      - {tenant: premium, slo_class: interactive, fraction: 0.2}
      - {tenant: free, slo_class: batch, fraction: 0.8}

    mix:                                     # a stream of its own per entry, superposed
      - {tenant: premium, slo_class: interactive, rate_per_s: 2}
      - {tenant: free, slo_class: batch, rate_per_s: 20}

Fractions: every request is drawn an entry after everything else is drawn (the requests are the
same as without the mix, only labelled). Rates: each entry's requests are generated as the
config's own (its arrival process at the entry's rate, the same length distributions), one entry
after the other from the one Generator, then merged by arrival time (ties: entry order) and cut to
num_requests / duration_s; ids are "<name>-<tenant or class>-<i>". Sessions take fractions only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.traces.synthetic_config import SyntheticConfig
    from servesim.traces.workload import RequestSpec

FRACTION_SUM_TOLERANCE = 1e-9


@dataclass(slots=True)
class MixEntry:
    tenant: str | None = None
    slo_class: str | None = None
    fraction: float | None = None  # its share of the one arrival stream
    rate_per_s: float | None = None  # or: a stream of its own at this rate

    @property
    def label(self) -> str:
        return "-".join(x for x in (self.tenant, self.slo_class) if x)


def _bad(where: str, value: object, allowed: str) -> InputError:
    return InputError(f"got {value!r}", field=f"mix{where}", allowed=allowed)


def mix_entries(raw: object) -> tuple[MixEntry, ...]:
    """The validated entries of a `mix:` list (entries as MixEntry or mappings)."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise _bad("", raw, "a non-empty list of {tenant, slo_class, fraction | rate_per_s}")
    entries = []
    for i, item in enumerate(raw):
        if isinstance(item, dict):
            unknown = sorted(set(item) - set(MixEntry.__dataclass_fields__))
            if unknown:
                raise _bad(f"[{i}].{unknown[0]}", item[unknown[0]], "keys tenant, slo_class, fraction, rate_per_s")
            item = MixEntry(**item)
        if not isinstance(item, MixEntry):
            raise _bad(f"[{i}]", item, "a mapping {tenant, slo_class, fraction | rate_per_s}")
        _check_entry(item, i)
        entries.append(item)
    by_rate = [e.rate_per_s is not None for e in entries]
    if any(by_rate) and not all(by_rate):
        raise _bad("", "fractions and rates mixed", "every entry a fraction, or every entry a rate_per_s")
    if not any(by_rate):
        total = math.fsum(e.fraction for e in entries)
        if abs(total - 1.0) > FRACTION_SUM_TOLERANCE:
            raise _bad("[].fraction", total, "fractions that sum to 1")
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise _bad("", labels, "distinct (tenant, slo_class) pairs")
    return tuple(entries)


def _check_entry(e: MixEntry, i: int) -> None:
    for name in ("tenant", "slo_class"):
        value = getattr(e, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise _bad(f"[{i}].{name}", value, "a non-empty string, or null")
    if e.tenant is None and e.slo_class is None:
        raise _bad(f"[{i}]", "neither tenant nor slo_class", "a tenant and/or an slo_class")
    if (e.fraction is None) == (e.rate_per_s is None):
        raise _bad(f"[{i}]", "both or neither of fraction and rate_per_s", "one of fraction, rate_per_s")
    for name in ("fraction", "rate_per_s"):
        value = getattr(e, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0 or (name == "fraction" and value > 1)):
            raise _bad(f"[{i}].{name}", value, "a number in (0, 1]" if name == "fraction" else "a number > 0")


def by_rate(mix: tuple[MixEntry, ...] | None) -> bool:
    return mix is not None and mix[0].rate_per_s is not None


def label_by_fraction(requests: list[RequestSpec], mix: tuple[MixEntry, ...],
                      rng: np.random.Generator) -> list[RequestSpec]:
    """Each request gets one entry's tenant and class, drawn by fraction."""
    p = np.array([e.fraction for e in mix], dtype=float)
    picks = rng.choice(len(mix), size=len(requests), p=p / p.sum())
    return [replace(r, tenant=mix[k].tenant, slo_class=mix[k].slo_class) for r, k in zip(requests, picks.tolist())]


def superposed(config: SyntheticConfig, rng: np.random.Generator,
               independent: Callable[[SyntheticConfig, np.random.Generator], list[RequestSpec]]) -> list[RequestSpec]:
    """One stream per entry (`independent` generates a config's requests), merged and cut."""
    assert config.mix is not None
    streams = []
    for e in config.mix:
        sub = replace(config, name=f"{config.name}-{e.label}", mix=None,
                      arrival=replace(config.arrival, rate_per_s=float(e.rate_per_s)))
        streams.append([replace(r, tenant=e.tenant, slo_class=e.slo_class) for r in independent(sub, rng)])
    merged = sorted((r for s in streams for r in s), key=lambda r: r.arrival_time_s)  # stable: entry order
    if config.duration_s is not None:
        merged = [r for r in merged if r.arrival_time_s < config.duration_s]
    if config.num_requests is not None:
        merged = merged[: config.num_requests]
    return merged
