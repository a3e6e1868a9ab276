"""What a cluster run cost, and the autoscaler's record of it, for the cluster summary and files.

GPU-hours are integrated over each replica's life on the cluster clock: from the decision that
asked for it (its cold start is billed: the node is rented from provisioning on) until it was
removed (drained or cancelled), or the run's end. A fixed fleet lives from 0 to the end. Dollars
are GPU-hours times the price of the replica's GPU (simulator/specs/gpu_prices.py: the shipped
table under the config's gpu_cost_per_hour).

    usd_per_day = usd / duration_s x 86,400        (the run's rate of spend, over a day)
    usd_per_million_tokens = usd / (prompt + output tokens of the requests served) x 1e6
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.simulator.columns import notna
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.cluster.cluster import Cluster
    from servesim.simulator.columns import Columns

@dataclass(slots=True)
class Lifetime:
    """One replica's life on the cluster clock (what its GPU-hours are billed over)."""

    pool: str
    name: str
    num_gpus: int
    gpu: str
    start_s: float  # the decision that asked for it (0 for the initial fleet: warm at the start)
    ready_s: float | None = None  # cold start over (None: cancelled before)
    drain_s: float | None = None
    end_s: float | None = None  # removed (drained or cancelled); None: alive at the run's end
    replica: int | None = None  # its Replica.index once built


def lifetimes(cluster: Cluster) -> list[Lifetime]:
    """Every replica's life, built or cancelled (a fixed fleet: each from 0 to the end)."""
    a = cluster.autoscaler
    fixed = [Lifetime(r.name, r.name, r.cfg.hardware.tp * r.cfg.hardware.pp, r.cfg.hardware.gpu, 0.0, 0.0,
                      replica=r.index) for r in cluster.replicas if a is None or r.index not in a.lifetimes]
    if a is None:
        return fixed
    return sorted(a.lifetimes.values(), key=lambda lt: (lt.start_s, lt.replica)) + a.cancelled + fixed


def cost_summary(cluster: Cluster, end_s: float, requests: Columns) -> dict:
    """The `cost` block of a cluster summary (prices: None where a GPU has no price)."""
    from servesim.simulator.specs.gpu_prices import price_per_gpu_hour

    lives = lifetimes(cluster)
    gpu_hours: dict[str, float] = {}
    for lt in lives:
        until = end_s if lt.end_s is None else min(lt.end_s, end_s)
        gpu_hours[lt.gpu] = gpu_hours.get(lt.gpu, 0.0) + lt.num_gpus * max(until - lt.start_s, 0.0) / 3600.0
    served = requests[notna(requests["first_token_s"])]
    tokens = int(served["prompt_len"].sum() + served["output_len"].sum())
    try:
        usd = sum(h * price_per_gpu_hour(g, cluster.cfg.gpu_cost_per_hour) for g, h in gpu_hours.items())
    except InputError as e:
        usd, note = None, e.detail
    else:
        note = None
    out = {"gpu_hours": sum(gpu_hours.values()), "gpu_hours_by_gpu": gpu_hours, "usd": usd,
           "usd_per_day": None if usd is None or end_s <= 0 else usd * 86400.0 / end_s,
           "usd_per_million_tokens": None if usd is None or tokens == 0 else usd / tokens * 1e6,
           "num_tokens": tokens, "duration_s": end_s,
           "prices_usd_per_gpu_hour": _prices(gpu_hours, cluster.cfg.gpu_cost_per_hour)}
    if note is not None:
        out["note"] = note
    return out


def _prices(gpu_hours: dict[str, float], overrides: dict[str, float]) -> dict[str, float | None]:
    from servesim.simulator.specs.gpu_prices import price_per_gpu_hour

    out: dict[str, float | None] = {}
    for g in gpu_hours:
        try:
            out[g] = price_per_gpu_hour(g, overrides)
        except InputError:
            out[g] = None
    return out
