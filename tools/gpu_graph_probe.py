"""Where a GPU-runner step's wall time goes: host dispatch or the GPU's own work.

    python3 tools/gpu_graph_probe.py [--device cuda|cpu] [--model llama-3.1-8b] [--csv FILE]

The runner (gpu_runner/model.py) runs its forward eagerly: ~30 PyTorch and Triton launches a
layer, each dispatched from Python. `--clock measured` times one step between two CUDA events, so
when the host issues kernels slower than the GPU runs them, the step's time is the host's. vLLM
replays decode steps as CUDA graphs, and the cost models price that. For the steps part 5 of
`make gpu-check` compares (decodes, prefills, one mixed step), this prints per step:

- eager_ms: one forward + logits between CUDA events, after a synchronize (what `--clock
  measured` and the calibration's whole-step rows record);
- host_ms: the wall time to issue that same call without waiting for the GPU;
- graph_ms: the same call captured once as a CUDA graph and replayed between events (the GPU's
  own time, launch overhead gone);
- roofline_ms / calibrated_ms: what the cost models price the same StepShape at (the calibrated
  column where a shipped profile of this model and GPU exists).

Median of --repeats each. On the CPU (`--device cpu`, the torch backend, tiny-llama by default)
there are no graphs and no events: eager_ms and host_ms are both perf_counter, graph_ms is empty;
that path exists so the script is tested where CI runs (tests/test_gpu_check.py). `make gpu-check`
runs it at the end of part 4.
Runs from a bare checkout as tools/gpu_check.py does (the root on sys.path, .gpu-carry's zips last).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

from gpu_check import ROOT, bootstrap  # this script's folder (tools/) is first on sys.path

FIELDS = ("step", "num_tokens", "num_requests", "eager_ms", "host_ms", "graph_ms", "roofline_ms", "calibrated_ms")


def probe_steps(device_type: str):
    """(label, StepShape) pairs: gpu-check part 5's probe steps on a GPU, two small ones on the CPU."""
    from gpucheck.calibration import probe_shapes

    from servesim.scheduler.step_shape import decode_shape, prefill_shape

    if device_type == "cuda":
        return probe_shapes()
    return [("decode 2 x 32", decode_shape(2, 32)), ("prefill 16", prefill_shape(16))]


def _median_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def time_step(fn, device, repeats: int) -> tuple[float, float, float | None]:
    """(eager_ms, host_ms, graph_ms) of fn; graph_ms None on the CPU."""
    import torch

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    fn()
    sync()
    eager, host = [], []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        if cuda:
            b.record()
            sync()
            eager.append(a.elapsed_time(b) / 1e3)
        else:
            eager.append(host[-1])
    if not cuda:
        return _median_ms(eager), _median_ms(host), None
    from servesim.gpu_runner.calibrate import Timer  # the calibration's graph timing, one warm-up

    return _median_ms(eager), _median_ms(host), 1e3 * Timer(device, repeats, warmup=1, graphs=True)(fn)


def cost_models(model_name: str, gpu: str) -> dict:
    from servesim.simulator.cost_model.base import make_cost_model
    from servesim.simulator.cost_model.calibrated import find_calibrated

    models = {"roofline": make_cost_model("roofline", model=model_name, gpu=gpu, tp=1)}
    if find_calibrated(model_name, gpu, 1) is not None:
        models["calibrated"] = make_cost_model("calibrated", model=model_name, gpu=gpu, tp=1)
    return models


def probe(device_type: str, model_name: str, gpu: str, repeats: int, block_size: int = 16,
          log=print) -> list[dict]:
    """One row per probe step (FIELDS); `log` gets a line per step."""
    import torch

    from servesim.gpu import runner_model
    from servesim.gpu_runner.calibrate import whole_step
    from servesim.gpu_runner.model import LlamaModel

    device = torch.device(device_type)
    cuda = device_type == "cuda"
    config = runner_model(model_name)
    model = LlamaModel.random(config, dtype=torch.bfloat16 if cuda else torch.float32, device=device,
                              backend="triton" if cuda else "torch")
    steps = probe_steps(device_type)
    num_blocks = 1 + max(sum(-(-(n + c) // block_size) for n, c in zip(s.num_new_tokens, s.num_context_tokens))
                         for _, s in steps)
    model.allocate_kv_cache(num_blocks, block_size)
    prices = cost_models(config.name, gpu)
    rows = []
    for label, shape in steps:
        fn = whole_step(model, list(shape.num_new_tokens), list(shape.num_context_tokens), block_size)
        eager, host, graph = time_step(fn, device, repeats)
        row = {"step": label, "num_tokens": sum(shape.num_new_tokens), "num_requests": len(shape.num_new_tokens),
               "eager_ms": eager, "host_ms": host, "graph_ms": graph}
        for name in ("roofline", "calibrated"):
            row[f"{name}_ms"] = 1e3 * prices[name].step_time_s(shape) if name in prices else None
        rows.append(row)
        log(f"{label}: eager {eager:.3f} ms, host {host:.3f} ms, graph {'-' if graph is None else f'{graph:.3f}'} ms")
    del model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    def cell(v) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(FIELDS) + " |", "|" + " --- |" * len(FIELDS)]
    lines += ["| " + " | ".join(cell(r[f]) for f in FIELDS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_graph_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default=None, help="a GPU-runner model (default llama-3.1-8b on cuda, tiny-llama on cpu)")
    ap.add_argument("--gpu", default="h200", help="the GPU the cost models price for (default h200)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per step, median kept (default 10)")
    ap.add_argument("--csv", type=Path, default=None, help="also write the rows here (a new file)")
    ap.add_argument("--carry", type=Path, default=ROOT / ".gpu-carry")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.csv is not None and args.csv.exists():
        ap.error(f"--csv {args.csv}: the file exists; name a new one")
    bootstrap(args.carry)
    from servesim.traces.errors import InputError

    model = args.model or ("llama-3.1-8b" if args.device == "cuda" else "tiny-llama")
    try:
        rows = probe(args.device, model, args.gpu, args.repeats, log=lambda line: print(line, flush=True))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    if args.csv is not None:
        tmp = args.csv.with_name(args.csv.name + ".partial")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
