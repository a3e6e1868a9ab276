"""Regenerate the error tables of docs/FIDELITY.md from every real run in ../shared.

    PYTHONPATH=. python tools/fidelity_table.py [--shared ../shared/data] [--only ID ...]

* per-request runs (LLMServingSim vLLM layout, ``benchmarks/llmservingsim_vllm_runs/*`` with the
  workload named by their ``meta.json`` under ``traces/llmservingsim_sharegpt/``): median APE of
  TTFT / TPOT / E2E and the error of the mean E2E, with the default (calibrated) cost model;
* per-stage runs (``benchmarks/blis_h100_trainval``): the signed error of each measured stage's
  TTFT mean, ITL mean, E2E mean and E2E p90 (calibrated where a fit exists, else roofline), with
  the CPU KV tier a run served with modelled; those runs again without it (cached as
  ``ID.no-cpu-tier``) for the "CPU tier on vs off" table, with what the tier served;
* aiconfigurator's silicon rows (``benchmarks/aiconfigurator_silicon``, closed-loop, one mean per
  row): median TTFT / TPOT errors per (model, weights, TP), as ``servesim validate-closed-loop``.

Only errors are written: the BLIS measurements themselves stay in ../shared (no licence). The
tables replace the text between the ``fidelity-table`` markers; results are also cached as JSON
in ``runs/fidelity/`` so ``--only`` can refresh one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "FIDELITY.md"
CACHE = ROOT / "runs" / "fidelity"
START, END = "<!-- fidelity-table:start -->", "<!-- fidelity-table:end -->"


def per_request_runs(shared: Path) -> list[tuple[str, Path, Path]]:
    out = []
    for run in sorted((shared / "benchmarks" / "llmservingsim_vllm_runs").glob("*/")):
        meta = json.loads((run / "meta.json").read_text())
        name = Path(str(meta.get("dataset_path", ""))).name
        wl = shared / "traces" / "llmservingsim_sharegpt" / f"{name}.gz"
        if wl.is_file():
            out.append((run.name, run, wl))
    return out


def run_one_request_level(run: Path, wl: Path) -> dict:
    from servesim.validation_report import ValidateOptions, validate_run

    rep = validate_run(run, wl, ValidateOptions(plots=False))
    pr = rep["per_request"]
    s = rep["settings"]
    return {"kind": "per_request", "run": run.name, "model": s["model"], "gpu": s["gpu"],
            "tp": s["tp"], "cost_model": rep["cost_model"]["name"],
            "ttft": pr["ttft"]["median_ape"], "tpot": pr["tpot"]["median_ape"],
            "e2e": pr["e2e"]["median_ape"], "e2e_mean_err": rep["aggregate"]["e2e"]["mean"]["error"]}


NO_TIER = ".no-cpu-tier"  # cache name suffix of a BLIS run simulated without the CPU KV tier it served with


def run_one_blis(path: Path, exp_id: str, cpu_tier: bool = True) -> dict:
    from servesim.simulator.validation.blis import validate_blis

    rep = validate_blis(path, exp_id, cpu_tier=cpu_tier)
    stages = {st: {k: v[k]["error"] for k in ("ttft_mean", "itl_mean", "e2e_mean", "e2e_p90")}
              for st, v in rep["stages"].items()}
    return {"kind": "per_stage" if cpu_tier else "per_stage_no_tier", "id": exp_id, "run": rep["experiment"],
            **rep["settings"], "stages": stages, "wall_s": rep["simulation"]["wall_time_s"],
            "prefix_cache": rep["prefix_cache"], "kv_offload": rep["kv_offload"]}


def render_cpu_tier(results: list[dict]) -> list[str]:
    """BLIS runs that served with a CPU KV tier: the summary row's errors with the tier modelled
    and without it, and what the modelled tier served (summary.json's kv_offload figures)."""
    off = {r["run"]: r for r in results if r["kind"] == "per_stage_no_tier"}
    rows = [(r, off[r["run"]]) for r in results if r["kind"] == "per_stage" and r["run"] in off]
    if not rows:
        return []
    lines = ["", "BLIS runs that served with a CPU KV tier (vLLM's OffloadingConnector, `--kv-offloading-size`): "
                 "signed error of the summary row with the tier modelled (on) and without it (off, "
                 "`--no-cpu-kv-tier`); GPU prefix-cache hit rate, and what the tier served (on):", "",
             "| run | tier | TTFT mean on | off | E2E mean on | off | E2E p90 on | off | GPU hit rate | "
             "CPU-tier hit tokens | loads | stores | GB stored / GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for on, no in rows:
        e, f, ko = on["stages"]["summary"], no["stages"]["summary"], on["kv_offload"] or {}
        lines.append(f"| {on['run']} | {on['cpu_kv_tier_gib']} GiB | {_pct(e['ttft_mean'])} | {_pct(f['ttft_mean'])} | "
                     f"{_pct(e['e2e_mean'])} | {_pct(f['e2e_mean'])} | {_pct(e['e2e_p90'])} | {_pct(f['e2e_p90'])} | "
                     f"{_abs(on['prefix_cache']['hit_rate'])} | {ko.get('cpu_hit_tokens', 0)} | "
                     f"{ko.get('num_loads', 0)} | {ko.get('num_stores', 0)} | "
                     f"{ko.get('bytes_stored_per_gpu', 0) / 1e9:.1f} |")
    return lines


def run_closed_loop_silicon(shared: Path) -> dict:
    """aiconfigurator's silicon rows (vLLM 0.12 on H100, fixed ISL/OSL, closed-loop clients; §5):
    every row with the default options, summarised per (model, weights, TP). Only means per row
    were measured, so these are errors of the mean, not per request."""
    import statistics

    from servesim.simulator.validation.closed_loop import closed_loop_results, load_silicon_rows

    rep = closed_loop_results(load_silicon_rows(shared / "benchmarks" / "aiconfigurator_silicon" / "silicon_sample.csv.gz"))
    groups: dict[tuple, list[dict]] = {}
    for r in rep["rows"]:
        if r["status"] == "ok":
            groups.setdefault((r["model"], r["precision"], r["tp"]), []).append(r)

    def med(rows: list[dict], key: str, signed: bool) -> float:
        return statistics.median(r[key] if signed else abs(r[key]) for r in rows)

    def cost_model(row: dict) -> str:  # the fit file a calibrated row used, or the model's name
        return "calibrated" if str(row["cost_model"]).endswith(".json.gz") else str(row["cost_model"])

    out = [{"model": m, "precision": p, "tp": tp, "rows": len(rs), "cost_model": cost_model(rs[0]),
            "ttft_ape": med(rs, "ttft_error", False), "ttft_signed": med(rs, "ttft_error", True),
            "tpot_ape": med(rs, "tpot_error", False), "tpot_signed": med(rs, "tpot_error", True)}
           for (m, p, tp), rs in sorted(groups.items())]
    return {"kind": "closed_loop", "run": "aiconfigurator_silicon", "groups": out,
            "num_unsupported": rep["summary"]["num_unsupported"]}


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.1f} %"


def _abs(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def blis_rows(results: list[dict]) -> list[dict]:
    """One result per BLIS run for the main table: with the CPU tier it served with modelled, or
    (where that run is not cached) without it."""
    runs: dict[str, dict] = {}  # experiment -> its row, in the order the runs first appear
    for r in results:
        if r["kind"] == "per_stage" or (r["kind"] == "per_stage_no_tier" and runs.get(r["run"]) is None):
            runs[r["run"]] = r
    return list(runs.values())


def _tier(r: dict) -> str:
    gib = r.get("cpu_kv_tier_gib")
    if r["kind"] == "per_stage_no_tier":
        return "off (not run with it)"
    return f"{gib} GiB" if gib else "none"


def render(results: list[dict]) -> str:
    lines = [START, "", "Per-request runs (median absolute percentage error per request; error of the mean E2E):", "",
             "| run | model | GPU | TP | cost model | TTFT | TPOT | E2E | mean E2E |", "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in results if r["kind"] == "per_request"):
        lines.append(f"| {r['run']} | {r['model']} | {r['gpu']} | {r['tp']} | {r['cost_model']} | "
                     f"{_abs(r['ttft'])} | {_abs(r['tpot'])} | {_abs(r['e2e'])} | {_pct(r['e2e_mean_err'])} |")
    lines += ["", "BLIS H100 runs, per load stage (signed error of the simulated statistic; + = simulator slower; "
                  "CPU tier: the CPU KV tier the run served with, as modelled):", "",
              "| run | model (weights) | TP | cost model | sampler | CPU tier | stage | TTFT mean | ITL mean | E2E mean | E2E p90 |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    blis = blis_rows(results)
    for r in blis:
        for st, e in r["stages"].items():
            sampler = r.get("sampling", {}).get("path", "—")
            lines.append(f"| {r['run']} | {r['model']} ({r['weight_dtype']}) | {r['tp']} | {r['cost_model']} | {sampler} | "
                         f"{_tier(r)} | {st} | {_pct(e['ttft_mean'])} | {_pct(e['itl_mean'])} | {_pct(e['e2e_mean'])} | "
                         f"{_pct(e['e2e_p90'])} |")
    stage_rows = [e for r in blis for st, e in r["stages"].items() if st != "summary"]
    if stage_rows:
        import statistics
        med = {k: statistics.median(abs(e[k]) for e in stage_rows) for k in ("ttft_mean", "itl_mean", "e2e_mean")}
        lines += ["", f"Median |error| over {len(stage_rows)} BLIS stages: TTFT mean {_abs(med['ttft_mean'])}, "
                      f"ITL mean {_abs(med['itl_mean'])}, E2E mean {_abs(med['e2e_mean'])}."]
    lines += render_cpu_tier(results)
    for r in (r for r in results if r["kind"] == "closed_loop"):
        lines += ["", "aiconfigurator silicon rows (vLLM 0.12, H100; fixed ISL/OSL, closed-loop clients, mean per row; "
                      "median over each group's rows; TTFT there is not validated, §5):", "",
                  "| model | weights | TP | rows | cost model | TTFT median APE | TTFT median signed | "
                  "TPOT median APE | TPOT median signed |", "|---|---|---|---|---|---|---|---|---|"]
        for g in r["groups"]:
            lines.append(f"| {g['model']} | {g['precision']} | {g['tp']} | {g['rows']} | {g['cost_model']} | "
                         f"{_abs(g['ttft_ape'])} | {_pct(g['ttft_signed'])} | {_abs(g['tpot_ape'])} | {_pct(g['tpot_signed'])} |")
        if r["num_unsupported"]:
            lines.append(f"\n{r['num_unsupported']} rows could not be simulated (see `servesim validate-closed-loop`).")
    lines += ["", f"Generated by `tools/fidelity_table.py` on {time.strftime('%Y-%m-%d')}.", "", END]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--only", action="append", default=[], help="run name or BLIS id to refresh")
    ap.add_argument("--no-run", action="store_true", help="render the cached results only (skip runs not cached)")
    args = ap.parse_args()
    from servesim.simulator.validation.blis import load_experiments

    CACHE.mkdir(parents=True, exist_ok=True)
    blis = args.shared / "benchmarks" / "blis_h100_trainval"
    jobs = [(name, lambda r=run, w=wl: run_one_request_level(r, w)) for name, run, wl in per_request_runs(args.shared)]
    for e in load_experiments(blis):  # each run, then (if it served with a CPU tier) the same without it
        jobs.append((e.id, lambda i=e.id: run_one_blis(blis, i)))
        if e.cpu_kv_blocks > 0:
            jobs.append((e.id + NO_TIER, lambda i=e.id: run_one_blis(blis, i, cpu_tier=False)))
    jobs.append(("aiconfigurator_silicon", lambda: run_closed_loop_silicon(args.shared)))
    results = []
    for name, job in jobs:
        cached = CACHE / f"{name}.json"
        if (args.no_run or (args.only and name not in args.only)) and cached.is_file():  # keep the cached result
            results.append(json.loads(cached.read_text()))
            continue
        if args.no_run:
            print(f"{name}: not cached, left out (--no-run)", flush=True)
            continue
        t0 = time.perf_counter()
        res = job()
        cached.write_text(json.dumps(res, indent=1))
        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
        results.append(res)
    text = DOC.read_text()
    table = render(results)
    if START in text:
        text = text[:text.index(START)] + table + text[text.index(END) + len(END):]
    else:
        text += "\n## Every real run (regenerated)\n\n" + table + "\n"
    DOC.write_text(text)
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
