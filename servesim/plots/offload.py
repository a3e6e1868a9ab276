""""How much CPU KV do I need?": a sweep over the size of vLLM's CPU KV tier (`kv_offload.
kv_offloading_size` GiB or `kv_offload.num_cpu_blocks`) drawn as TTFT and hit rates against the
tier's size. `servesim plot` / report.html include it whenever a sweep varies the tier.

Hit rates, each as its run reports it:
* GPU prefix cache: summary `prefix_cache_hit_rate` (vLLM's: hit tokens / queried tokens over
  every admission lookup, preempted requests apart);
* CPU tier: summary `kv_offload.cpu_hit_rate` (of the tokens the GPU cache lacked at a lookup,
  the share the tier supplied; vLLM's connector_prefix_cache_stats);
* combined: per request, the prompt tokens it did not compute at admission (`num_cached_tokens`:
  GPU hits plus tokens loaded from the tier) over its prompt, summed over finished requests.
"""

from __future__ import annotations

import pandas as pd

from servesim.plots import style
from servesim.scenario.model import short_label

TIER_KEYS = ("kv_offload.kv_offloading_size", "kv_offload.num_cpu_blocks")  # GiB, offload blocks


def tier_axis(sweep) -> str | None:
    """The swept key that sizes the CPU tier, or None when the sweep does not vary it."""
    for axis in sweep.info.get("axes", []):
        keys = axis.get("keys", [])
        if len(keys) == 1 and keys[0] in TIER_KEYS:
            return keys[0]
    return None


def tier_sizing_table(sweep) -> pd.DataFrame:
    """One row per completed variant: tier size (0 = off), series (the other swept keys), TTFT mean
    and p90 (s), and the three hit rates (module doc), sorted by series then size."""
    key = tier_axis(sweep)
    if key is None:
        raise ValueError("the sweep does not vary the CPU KV tier (kv_offload.kv_offloading_size or num_cpu_blocks)")
    params = {v["name"]: v["params"] for v in sweep.info.get("variants", [])}
    rows = []
    for _, r in sweep.table[sweep.table["status"] == "ok"].iterrows():
        p = params.get(r["variant"], {})
        size = p.get(key)
        req = sweep.variant(r["variant"]).requests
        done = req[req["finish_s"].notna()]
        prompt = float(done["prompt_len"].sum())
        cpu_rate = r.get("kv_offload.cpu_hit_rate")
        rows.append({"variant": r["variant"], "tier": float(size or 0),
                     "series": short_label({k: v for k, v in p.items() if k != key}),
                     "ttft_mean_s": float(r["ttft_s.mean"]), "ttft_p90_s": float(r["ttft_s.p90"]),
                     "gpu_hit_rate": float(r["prefix_cache_hit_rate"]),
                     "cpu_hit_rate": 0.0 if cpu_rate is None or pd.isna(cpu_rate) else float(cpu_rate),
                     "combined_hit_rate": float(done["num_cached_tokens"].fillna(0).sum()) / prompt if prompt else 0.0})
    return pd.DataFrame(rows).sort_values(["series", "tier"], kind="stable").reset_index(drop=True)


def tier_sizing(sweep, title: str | None = None):
    """TTFT mean / p90 (left) and GPU / CPU-tier / combined hit rates (right) against tier size."""
    key = tier_axis(sweep)
    t = tier_sizing_table(sweep)
    unit = "GiB" if key == TIER_KEYS[0] else "offload blocks"
    fig = style.figure(11, 3.8)
    left, right = style.subplots(fig, 1, 2).ravel()
    tu = style.time_unit(t["ttft_mean_s"])
    for i, (series, g) in enumerate(t.groupby("series", sort=False)):
        tag = f" ({series})" if series else ""
        c = style.color(i)
        left.plot(g["tier"], g["ttft_mean_s"] * tu[1], marker="o", color=c, label=f"mean{tag}")
        left.plot(g["tier"], g["ttft_p90_s"] * tu[1], marker="s", ls="--", color=c, label=f"p90{tag}")
        for col, name, ls in (("gpu_hit_rate", "GPU prefix cache (per lookup)", ":"), ("cpu_hit_rate", "CPU tier (of GPU misses)", "--"),
                              ("combined_hit_rate", "combined (prompt tokens not recomputed)", "-")):
            right.plot(g["tier"], 100 * g[col], marker="o", ls=ls, color=c if len(t["series"].unique()) > 1
                       else style.color(("gpu_hit_rate", "cpu_hit_rate", "combined_hit_rate").index(col)),
                       label=f"{name}{tag}")
    sizes = sorted(t["tier"].unique())
    for ax in (left, right):
        ax.set_xticks(sizes, ["off" if s == 0 else f"{s:g}" for s in sizes])
        ax.set_xlabel(f"CPU KV tier ({unit})")
        ax.set_ylim(bottom=0)
        ax.legend(frameon=False, fontsize=7.5)
    if len(sizes) > 2 and sizes[-1] / max(sizes[1], 1e-9) >= 8:
        for ax in (left, right):  # 0, 8, 16 .. 128: log-like spacing reads better; "off" sits left of the first size
            ax.set_xscale("symlog", linthresh=max(sizes[1], 1e-9))
            ax.set_xticks(sizes, ["off" if s == 0 else f"{s:g}" for s in sizes])
            ax.minorticks_off()
    left.set_title("TTFT")
    left.set_ylabel(f"TTFT ({tu[0]})")
    right.set_title("Hit rates")
    right.set_ylabel("%")
    right.set_ylim(0, 100)
    fig.suptitle(title or f"{sweep.info.get('scenario', 'sweep')}: how much CPU KV? (TTFT and hit rates vs tier size)")
    return fig


__all__ = ["TIER_KEYS", "tier_axis", "tier_sizing", "tier_sizing_table"]
