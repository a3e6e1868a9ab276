"""GPU-hour prices: the shipped table (gpu_prices.yaml: a figure, its source and the date it was
read, per GPU kind) under a run's own overrides. Every cost servesim reports reads prices here.

    price_per_gpu_hour("h100")                 # the table's figure
    price_per_gpu_hour("h100", {"h100": 2.5})  # a config's gpu_cost_per_hour wins
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from servesim.traces.errors import InputError

from ._yaml import load_spec_file
from .gpus import resolve_gpu

_PRICE_FILE = Path(__file__).with_name("gpu_prices.yaml")


@dataclass(slots=True, frozen=True)
class GpuPrice:
    gpu: str  # canonical GPU name (gpus.yaml)
    usd_per_hour: float  # per GPU
    source: str  # where the figure is published
    read: str  # the date it was read (YYYY-MM-DD)


@cache
def shipped_prices() -> dict[str, GpuPrice]:
    """The shipped table, by canonical GPU name (checked against gpus.yaml on load)."""
    out: dict[str, GpuPrice] = {}
    for name, entry in load_spec_file(_PRICE_FILE).items():
        gpu = resolve_gpu(name).name
        if set(entry) != {"usd_per_hour", "source", "read"} or not entry["usd_per_hour"] > 0:
            raise InputError(f"gpu price {name!r}: {entry!r}", path=str(_PRICE_FILE), field=name,
                             allowed="{usd_per_hour: > 0, source, read}")
        out[gpu] = GpuPrice(gpu, float(entry["usd_per_hour"]), str(entry["source"]), str(entry["read"]))
    return out


def check_price_overrides(table: Mapping[str, float], field: str = "gpu_cost_per_hour") -> dict[str, float]:
    """A config's {gpu: dollars per GPU-hour}, keyed by canonical GPU name; bad input raises."""
    if not isinstance(table, Mapping):
        raise InputError(f"got {table!r}", field=field, allowed="{gpu: dollars per GPU-hour >= 0}")
    out: dict[str, float] = {}
    for k, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise InputError(f"got {k}: {v!r}", field=f"{field}.{k}", allowed="a number >= 0 (dollars per GPU-hour)")
        out[resolve_gpu(k).name] = float(v)
    return out


def price_per_gpu_hour(gpu: str, overrides: Mapping[str, float] | None = None,
                       field: str = "gpu_cost_per_hour") -> float:
    """Dollars per GPU-hour of `gpu` (any alias): the override when given, else the shipped figure."""
    name = resolve_gpu(gpu).name
    if overrides and name in overrides:
        return overrides[name]
    price = shipped_prices().get(name)
    if price is None:
        known = sorted(set(shipped_prices()) | set(overrides or {}))
        raise InputError(f"no price for GPU {name!r}", field=field,
                         allowed=f"a {field} entry for it (priced: {', '.join(known)})")
    return price.usd_per_hour
