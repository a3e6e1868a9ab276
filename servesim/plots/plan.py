"""`servesim plan`'s figure: goodput against cost per deployment shape, the frontier, the pick."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot_frontier(df: pd.DataFrame, threshold: float, path: str | Path, cost_label: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    valid = df[df["error"].isna()]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for shape, g in valid.groupby("shape", sort=False):
        ax.plot(g["cost"], g["goodput_fraction"], "o-", alpha=0.6, label=shape)
    front = valid[valid["frontier"]].sort_values("cost")
    ax.step(front["cost"], front["goodput_fraction"], where="post", color="black", lw=1.5, label="frontier")
    best = valid[valid["best"]]
    if not best.empty:
        ax.scatter(best["cost"], best["goodput_fraction"], s=160, marker="*", color="red", zorder=5,
                   label="cheapest meeting SLO")
    ax.axhline(threshold, ls="--", color="gray", lw=1)
    ax.set_xlabel(cost_label)
    ax.set_ylabel("fraction of requests meeting TTFT and TPOT SLOs")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
