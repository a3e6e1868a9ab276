"""Calibration report: fit a cost model from a profile's op rows, predict its whole-step rows, and
show predicted vs measured step time with the error (table + plot)."""

from __future__ import annotations

from pathlib import Path


def report_paths(profile_path: Path) -> tuple[Path, Path]:
    """The side files write_report puts beside a profile: the step table and its figure."""
    base = Path(profile_path).with_suffix("")
    return Path(f"{base}.report.csv"), Path(f"{base}.report.png")


def write_report(profile_path: Path, model: str, gpu: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from servesim.simulator.cost_model.base import StepShape
    from servesim.simulator.cost_model.fit import fit
    from servesim.simulator.cost_model.profile_schema import read_profile

    prof = read_profile(profile_path)
    ops_rows = prof[~prof["op"].isin(["model_prefill", "model_decode"])]
    steps = prof[prof["op"].isin(["model_prefill", "model_decode"])].copy()
    fitted = fit(ops_rows, model, gpu, 1, holdout_fraction=0.0)
    preds = []
    for r in steps.itertuples():
        if r.op == "model_prefill":
            shape = StepShape((int(r.chunk_len),), (int(r.prefix_len or 0),), 1)
        else:
            b = int(r.batch_size)
            shape = StepShape((1,) * b, (int(r.context_len),) * b, b)
        preds.append(fitted.step_time_s(shape))
    steps["predicted_s"] = preds
    steps["error"] = (steps["predicted_s"] - steps["latency_s"]) / steps["latency_s"]
    cols = ["op", "batch_size", "chunk_len", "context_len", "latency_s", "predicted_s", "error"]
    table = steps[cols].rename(columns={"latency_s": "measured_s"})
    from servesim.simulator.outfile import atomic_path

    csv_path, png_path = report_paths(profile_path)
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False)
    fig, ax = plt.subplots(figsize=(6, 5))
    for op, marker in (("model_prefill", "o"), ("model_decode", "s")):
        t = table[table.op == op]
        ax.scatter(1e3 * t.measured_s, 1e3 * t.predicted_s, marker=marker, label=op.replace("model_", ""))
    lim = [0, 1.05e3 * max(table.measured_s.max(), table.predicted_s.max())]
    ax.plot(lim, lim, "k--", lw=1, label="exact")
    ax.set(xlabel="measured step time (ms)", ylabel="predicted step time (ms)", xlim=lim, ylim=lim,
           title=f"{model} on {gpu} (measured on {prof['device'].iloc[0]}): fitted model vs steps")
    ax.legend()
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    abs_err = table["error"].abs()
    summary = f"step-time error: median {100 * abs_err.median():.1f} %, mean {100 * abs_err.mean():.1f} %, " \
              f"max {100 * abs_err.max():.1f} % over {len(table)} steps"
    lines = [table.to_string(index=False, float_format=lambda v: f"{v:.4g}"), summary,
             f"report: {csv_path}, {png_path}"]
    return "\n".join(lines)

