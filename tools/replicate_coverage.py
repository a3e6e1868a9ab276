"""Coverage of the replicates' 90 % prediction interval on the real runs (docs/FIDELITY.md, "Coverage").

    PYTHONPATH=. python tools/replicate_coverage.py [--replicates 4] [--workers 2] [--only 60 61] [--report-only] [--doc]

Each real run is validated as `servesim validate` does (the same config, cost model and workload),
once per replicate: replicate k gets the seed and the cost-model factors servesim/replicates.py gives
it (drawn from the run's cost model's measured error, simulator/cost_model/perturbed.py), applied as
`--set` items on top of the validation config. Per run, stage and statistic, the replicates' values
give a 90 % prediction interval (servesim/intervals.py); the check is whether the measured value lies
in it. Nothing here is tuned: the sigmas come from kernel tables only.

* BLIS H100 runs (benchmarks/blis_h100_trainval): per stage and the summary row, the seven measured
  statistics (TTFT mean/p90/p99, ITL mean, E2E mean/p90/p99); their workloads are constant-rate, so
  the cost-model error is the only thing that varies. Runs 48 and 67 are left out by default (each
  takes 2-4 min compiled, ~30 min in pure Python per replicate; `--only 48 67` runs them).
* the vLLM 0.19 per-request run (benchmarks/llmservingsim_vllm_runs): TTFT / TPOT / E2E mean, p50,
  p90, p99 of the paired requests.

Only the coverage and the errors are printed: measured BLIS values stay in ../shared (no licence).
Results per (run, replicate) are cached in runs/coverage/ so a rerun only computes what is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "runs" / "coverage"
SLOW_BLIS = ("48", "67")
# Cheapest first (the compiled build's wall seconds of `tools/fidelity_table.py`), so a run cut short by
# time has covered whole runs: 17 65 21 60 20 62 66 64 61 63 then the rest.
ORDER = ("17", "65", "21", "60", "20", "62", "66", "64", "61", "63")


def _sets(rep) -> tuple[str, ...]:
    out = [f"seed={rep.seed}"]
    if rep.factors is not None:
        f = rep.factors
        out += ["cost_model.params.factors={" + ", ".join(f"{k}: {v!r}" for k, v in f.items()) + "}"]
    return tuple(out)


def _with_base(sets: tuple[str, ...], base: str) -> tuple[str, ...]:
    return (*sets, "cost_model.name=perturbed", f"cost_model.params.base={base}") if len(sets) > 1 else sets


def blis_job(shared: str, exp_id: str, k: int, n: int) -> dict:
    from servesim.replicates import cost_model_perturbation, plan_replicates
    from servesim.simulator.validation.blis import blis_config, find_experiment, validate_blis

    path = Path(shared) / "benchmarks" / "blis_h100_trainval"
    cfg, info = blis_config(find_experiment(path, exp_id))
    rep = plan_replicates(cfg.seed, n, cost_model_perturbation(cfg))[k]
    r = validate_blis(path, exp_id, sets=_with_base(_sets(rep), info["cost_model"]))
    return {"run": r["experiment"], "cost_model": info["cost_model"],
            "values": {f"{st}.{m}": [v[m]["simulated_ms"], v[m]["measured_ms"]] for st, v in r["stages"].items()
                       for m in v if m != "requests"}}


def per_request_job(shared: str, name: str, k: int, n: int) -> dict:
    from servesim.replicates import cost_model_perturbation, plan_replicates
    from servesim.simulator.validation.replay import ValidateOptions, build_config, compare_run
    from servesim.simulator.validation.runs import load_run

    run = Path(shared) / "benchmarks" / "llmservingsim_vllm_runs" / name
    meta = json.loads((run / "meta.json").read_text())
    wl = Path(shared) / "traces" / "llmservingsim_sharegpt" / f"{Path(str(meta.get('dataset_path', ''))).name}.gz"
    cfg, info = build_config(load_run(run), ValidateOptions(plots=False))
    rep = plan_replicates(cfg.seed, n, cost_model_perturbation(cfg))[k]
    r = compare_run(run, wl, ValidateOptions(plots=False, seed=rep.seed,
                                             sets=_with_base(_sets(rep), cfg.cost_model.name))).report
    return {"run": name, "cost_model": cfg.cost_model.name,
            "values": {f"{metric}.{st}": [_ms(v["simulated"]), _ms(v["measured"])]
                       for metric, stats in r["aggregate"].items() for st, v in stats.items()}}


def _ms(x):
    return None if x is None else x * 1e3


def _cached(kind: str, shared: str, run_id: str, k: int, n: int) -> dict:
    path = CACHE / f"{run_id}.r{k}.json"  # replicate k is the same whatever n (seeds and factors by k)
    if path.is_file():
        return json.loads(path.read_text())
    out = (blis_job if kind == "blis" else per_request_job)(shared, run_id, k, n)
    path.write_text(json.dumps(out) + "\n")
    return out


def family(key: str) -> str:
    """TTFT, TPOT/ITL, E2E or queueing, from a check's key ("stage_0.ttft_mean", "tpot.p90")."""
    name = key.rsplit(".", 1)[-1] if key.startswith(("stage_", "summary")) else key.split(".")[0]
    for fam, prefixes in (("TTFT", ("ttft",)), ("TPOT / ITL", ("tpot", "itl")), ("E2E", ("e2e",)),
                          ("queueing", ("queueing",))):
        if name.startswith(prefixes):
            return fam
    return "other"


def coverage(results: dict[str, list[dict]]) -> tuple[list[dict], int, int]:
    from servesim.intervals import interval

    rows, hits, total = [], 0, 0
    by_family: dict[str, list[int]] = {}
    for run_id, reps in results.items():
        inside = checks = 0
        errs = []
        for key in reps[0]["values"]:
            sims = [r["values"][key][0] for r in reps]
            measured = reps[0]["values"][key][1]
            if measured is None or any(v is None for v in sims) or not measured:
                continue
            iv = interval(sims)
            hit = iv.pi_low <= measured <= iv.pi_high
            inside += hit
            checks += 1
            fam = by_family.setdefault(family(key), [0, 0])
            fam[0], fam[1] = fam[0] + hit, fam[1] + 1
            errs.append((iv.mean / measured - 1, (iv.pi_high - iv.pi_low) / 2 / measured))
        rows.append({"run": reps[0]["run"], "cost_model": reps[0]["cost_model"], "inside": inside, "checks": checks,
                     "median_abs_error": sorted(abs(e) for e, _ in errs)[len(errs) // 2] if errs else None,
                     "median_half_width": sorted(w for _, w in errs)[len(errs) // 2] if errs else None})
        hits, total = hits + inside, total + checks
    rows.append({"by_family": by_family})
    return rows, hits, total


START, END = "<!-- coverage-table:start -->", "<!-- coverage-table:end -->"


def render(rows: list[dict], hits: int, total: int, n: int) -> str:
    families = rows.pop()["by_family"]
    lines = ["| run | cost model | measured inside the 90 % interval | median abs. error of the mean | "
             "median half-width |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['cost_model']} | {r['inside']}/{r['checks']} | {100 * r['median_abs_error']:.1f} % | "
              f"{100 * r['median_half_width']:.1f} % |" for r in rows]
    lines += ["", "| metric | inside / checks |", "|---|---:|"]
    lines += [f"| {fam} | {inside}/{checks} ({100 * inside / checks:.0f} %) |"
              for fam, (inside, checks) in sorted(families.items())]
    lines += ["", f"All checks: {hits}/{total} = {100 * hits / max(total, 1):.0f} % inside ({n} replicates per run)."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--replicates", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--report-only", action="store_true", help="only the runs whose replicates are all cached")
    ap.add_argument("--doc", action="store_true", help="write the tables into docs/FIDELITY.md (between its markers)")
    args = ap.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    from servesim.simulator.validation.blis import load_experiments

    blis = [e.id for e in load_experiments(Path(args.shared) / "benchmarks" / "blis_h100_trainval")]
    blis = sorted(blis, key=lambda i: ORDER.index(i) if i in ORDER else len(ORDER))
    per_request = [p.name for p in sorted((Path(args.shared) / "benchmarks" / "llmservingsim_vllm_runs").glob("*/"))]
    runs = [("per_request", p) for p in per_request if not args.only or p in args.only]
    runs += [("blis", i) for i in blis if (i in args.only if args.only else i not in SLOW_BLIS)]
    n = args.replicates
    if args.report_only:
        runs = [(kind, r) for kind, r in runs if all((CACHE / f"{r}.r{k}.json").is_file() for k in range(n))]
    jobs = [(kind, run_id, k) for kind, run_id in runs for k in range(n)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = {job: pool.submit(_cached, job[0], args.shared, job[1], job[2], n) for job in jobs}
        results: dict[str, list[dict]] = {}
        for (kind, run_id, k), fut in futures.items():
            results.setdefault(run_id, []).append(fut.result())
            print(f"  {run_id} r{k} done", flush=True)
    rows, hits, total = coverage(results)
    text = render(rows, hits, total, n)
    print("\n" + text)
    if args.doc:
        doc = ROOT / "docs" / "FIDELITY.md"
        body = doc.read_text()
        i, j = body.index(START) + len(START), body.index(END)
        doc.write_text(body[:i] + "\n" + text + "\n" + body[j:])
        print(f"wrote the tables into {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
