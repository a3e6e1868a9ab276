"""The result side of `vllm bench serve` on a simulated run: its percentile flags and its result file.

    opts = BenchResultOptions(percentile_metrics=("ttft", "e2el"), metric_percentiles=(50.0, 99.0),
                              save_result=True, result_dir="results", label="sim")
    path = write_result(res.requests, opts, BenchTraffic(num_prompts=500, request_rate=8.0),
                        model_id="meta-llama/Llama-3.1-8B")

The file is the dict vLLM 0.19.1's `vllm/benchmarks/serve.py` writes with `--save-result` (keys in
its order): the setup (`date`, `endpoint_type`, `backend`, `label`, `model_id`, `tokenizer_id`,
`num_prompts`), `--metadata` KEY=VALUE pairs, the traffic (`request_rate` ("inf" when unbounded),
`burstiness`, `max_concurrency`), then the benchmark figures (`duration`, `completed`, `failed`,
token totals, throughputs, `request_goodput` (None without `--goodput`), `max_output_tokens_per_s`,
`max_concurrent_requests`, `rtfx`) and, for each metric of `--percentile-metrics`, `mean_/median_/
std_<metric>_ms` and `p<P>_<metric>_ms` for each `--metric-percentiles` P. `--save-detailed` adds
the per-request lists (`input_lens`, `output_lens`, `ttfts`, `itls`, `start_times`,
`generated_texts`, `errors`), in seconds as vLLM writes them; `start_times` are simulated send times.
`--append-result` adds the result to an existing file after a newline (one JSON object per line), as
serve.py's "a+" mode does, and writes a new file where there is none.

What differs by necessity: `backend` is "servesim" (no HTTP endpoint was called), generated texts
are empty strings (the simulator makes no text), and `date` is the wall-clock time of writing
(vLLM's `%Y%m%d-%H%M%S`), or SOURCE_DATE_EPOCH when set, so a result can be written reproducibly.
The figures follow bench's rules (simulator/bench_metrics.py); the peak output-token rate and peak
concurrency use its one-second buckets over chunk arrival times (`calculate_metrics`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from servesim.simulator.bench_metrics import BENCH_METRICS, GoodputSlo, bench_serve_result, completed_mask
from servesim.traces.errors import InputError

# vLLM 0.19.1 benchmarks/serve.py: `default_percentile_metrics = "ttft,tpot,itl"` for generative
# models, `--metric-percentiles` default "99".
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_METRIC_PERCENTILES = (99.0,)
# The fields serve.py deletes unless --save-detailed.
DETAILED_FIELDS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors")
BACKEND = "servesim"


@dataclass(slots=True)
class BenchResultOptions:
    """The result flags of `vllm bench serve`, validated as its argument parser and main() do."""

    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES
    save_result: bool = False
    save_detailed: bool = False
    result_dir: str | None = None  # folder of the result file (created); None: the working directory
    result_filename: str | None = None  # None: vLLM's {label}-{rate}qps[-concurrencyN]-{model}-{date}.json
    label: str | None = None  # None: the backend name
    metadata: tuple[tuple[str, str], ...] = ()  # --metadata KEY=VALUE pairs, written as top-level keys
    append_result: bool = False  # add the result as a new line of an existing file (vLLM's "a+" mode)

    @property
    def writes(self) -> bool:
        """Whether a result file is written: --save-result or --append-result (either, as serve.py)."""
        return self.save_result or self.append_result

    def __post_init__(self) -> None:
        self.percentile_metrics = tuple(self.percentile_metrics)
        self.metric_percentiles = tuple(float(p) for p in self.metric_percentiles)
        for name in self.percentile_metrics:
            if name not in BENCH_METRICS:
                raise InputError(f"unknown metric {name!r}", field="--percentile-metrics",
                                 allowed=", ".join(BENCH_METRICS))
        if not self.percentile_metrics:
            raise InputError("no metric named", field="--percentile-metrics", allowed=", ".join(BENCH_METRICS))
        for p in self.metric_percentiles:
            if not (math.isfinite(p) and 0.0 <= p <= 100.0):
                raise InputError(f"got {p!r}", field="--metric-percentiles", allowed="numbers in [0, 100]")
        if not self.metric_percentiles:
            raise InputError("no percentile given", field="--metric-percentiles", allowed="e.g. 50,90,99")
        if not self.writes:
            for flag, value in (("--save-detailed", self.save_detailed), ("--result-dir", self.result_dir),
                                ("--result-filename", self.result_filename), ("--metadata", self.metadata),
                                ("--label", self.label)):
                if value:
                    raise InputError(f"{flag} without --save-result writes nothing", field=flag,
                                     allowed="add --save-result or --append-result (the result file is "
                                             "written only then)")
        if self.result_filename is not None and (not self.result_filename or self.result_filename.endswith("/")):
            raise InputError(f"got {self.result_filename!r}", field="--result-filename", allowed="a file name")


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    """`--percentile-metrics ttft,e2el` (None: vLLM's default for generative models)."""
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """`--metric-percentiles 50,90,99`."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        try:
            out.append(float(item))
        except ValueError:
            raise InputError(f"got {item!r} in {text!r}", field="--metric-percentiles",
                             allowed="comma-separated numbers in [0, 100], e.g. 50,90,99") from None
    return tuple(out)


def parse_metadata(items: list[str]) -> tuple[tuple[str, str], ...]:
    """`--metadata version=0.3.3 tp=1`: pairs split at the first '=' and stripped, as serve.py does."""
    out = []
    for item in (x for arg in items for x in arg.split()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"got {item!r}", field="--metadata", allowed="KEY=VALUE pairs")
        out.append((key.strip(), value.strip()))
    return tuple(out)


@dataclass(slots=True)
class BenchTraffic:
    """What the result file records of how the client sent the requests."""

    num_prompts: int
    request_rate: float = math.inf  # requests/s; inf: every request at t = 0
    burstiness: float = 1.0
    max_concurrency: int | None = None


def result_date() -> str:
    """vLLM's `datetime.now().strftime("%Y%m%d-%H%M%S")`; SOURCE_DATE_EPOCH (UTC) when set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None:
        try:
            when = datetime.fromtimestamp(int(epoch), tz=timezone.utc)
        except ValueError:
            raise InputError(f"got {epoch!r}", field="SOURCE_DATE_EPOCH",
                             allowed="an integer number of seconds since 1970") from None
    else:
        when = datetime.now()
    return when.strftime("%Y%m%d-%H%M%S")


def result_json(requests, opts: BenchResultOptions, traffic: BenchTraffic, model_id: str,
                goodput: GoodputSlo | None = None, date: str | None = None) -> dict:
    """The dict `vllm bench serve --save-result` writes, for a run's requests table."""
    out: dict = {"date": date or result_date(), "endpoint_type": BACKEND, "backend": BACKEND,
                 "label": opts.label, "model_id": model_id, "tokenizer_id": model_id,
                 "num_prompts": traffic.num_prompts}
    out.update(dict(opts.metadata))
    out["request_rate"] = traffic.request_rate if traffic.request_rate < math.inf else "inf"
    out["burstiness"] = traffic.burstiness
    out["max_concurrency"] = traffic.max_concurrency
    figures = bench_serve_result(requests, goodput if goodput is not None and goodput.is_set else None,
                                 opts.metric_percentiles)
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        out[key] = figures[key]
    detail = _detail(requests)
    if opts.save_detailed:
        out.update({k: detail[k] for k in DETAILED_FIELDS[:2]})
        out.update({k: detail[k] for k in ("ttfts", "itls", "start_times", "generated_texts", "errors")})
    out["max_output_tokens_per_s"], out["max_concurrent_requests"] = _peaks(requests)
    out["rtfx"] = 0.0  # audio seconds per second: no audio requests here
    for metric in BENCH_METRICS:  # serve.py's order: ttft, tpot, itl, e2el
        if metric in opts.percentile_metrics:
            for key in (f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms"):
                out[key] = figures[key]
            for p in opts.metric_percentiles:
                word = str(int(p)) if int(p) == p else str(p)
                out[f"p{word}_{metric}_ms"] = figures[f"p{p:g}_{metric}_ms"]
    return out


def _chunk_times(first_s: float, gaps) -> np.ndarray:
    """When each chunk of a request reached the client: the first token, then each positive gap
    (tokens of one chunk share a time, as bench sees one chunk)."""
    gaps = np.asarray(gaps, dtype=np.float64)
    return first_s + np.concatenate(([0.0], np.cumsum(gaps[gaps > 0])))


def _detail(requests) -> dict:
    """The per-request lists of a detailed result, in the table's order (failed requests: output
    length 0, no TTFT, an error naming the status)."""
    done = completed_mask(requests)
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    first = np.asarray(requests["first_token_s"], dtype=float)
    statuses = list(requests["status"]) if "status" in requests.columns else ["completed" if d else "failed"
                                                                               for d in done]
    out_lens = np.where(done, np.asarray(requests["output_len"]), 0)
    itls = [[float(g) for g in np.asarray(v, dtype=float) if g > 0] if ok else []
            for v, ok in zip(requests["itl_s"], done)]
    return {"input_lens": [int(x) for x in np.asarray(requests["prompt_len"])],
            "output_lens": [int(x) for x in out_lens],
            "ttfts": [float(f - a) if ok else 0.0 for f, a, ok in zip(first, arrival, done)],
            "itls": itls, "start_times": [float(a) for a in arrival],
            "generated_texts": ["" for _ in arrival],
            "errors": ["" if ok else f"request {s}" for s, ok in zip(statuses, done)]}


def _peaks(requests) -> tuple[float, int]:
    """serve.py's peak output tokens per second and peak concurrent requests: one-second buckets
    from the first completed request's send; a request counts in every bucket from its send's to
    its end's, inclusive."""
    done = completed_mask(requests)
    if not done.any():
        return 0.0, 0
    start = np.asarray(requests["arrival_s"], dtype=float)[done]
    end = np.asarray(requests["finish_s"], dtype=float)[done]
    first = np.asarray(requests["first_token_s"], dtype=float)[done]
    gaps = [v for v, ok in zip(requests["itl_s"], done) if ok]
    t0 = float(start.min())
    buckets = int(math.ceil(float(end.max()) - t0)) + 1
    tokens = np.concatenate([_chunk_times(f, g) for f, g in zip(first, gaps)]) - t0
    tokens = tokens[(tokens >= 0) & (tokens < buckets)].astype(np.int64)
    per_s = np.bincount(tokens, minlength=buckets)
    change = np.zeros(buckets + 1, dtype=np.int64)
    np.add.at(change, (start - t0).astype(np.int64), 1)
    np.add.at(change, (end - t0).astype(np.int64) + 1, -1)
    return float(per_s.max()), int(np.cumsum(change)[:buckets].max())


def result_path(opts: BenchResultOptions, traffic: BenchTraffic, model_id: str, date: str) -> Path:
    """serve.py's compute_result_filename: --result-filename, else
    {label}-{request_rate}qps[-concurrency{N}]-{model basename}-{date}.json, under --result-dir."""
    label = opts.label or BACKEND
    rate = "inf" if math.isinf(traffic.request_rate) else repr(float(traffic.request_rate))
    concurrency = f"-concurrency{traffic.max_concurrency}" if traffic.max_concurrency is not None else ""
    name = opts.result_filename or f"{label}-{rate}qps{concurrency}-{model_id.split('/')[-1]}-{date}.json"
    return Path(opts.result_dir).expanduser() / name if opts.result_dir else Path(name)


def write_result(requests, opts: BenchResultOptions, traffic: BenchTraffic, model_id: str,
                 goodput: GoodputSlo | None = None) -> Path:
    """Write the result file; its path. An existing file is replaced, as vLLM's "w" mode does, or
    with `append_result` kept and the result added after a newline, as its "a+" mode does (a file
    whose lines are not JSON objects is refused rather than appended to). Written atomically: a
    failure leaves the earlier file as it was."""
    from servesim.simulator.outfile import atomic_text

    date = result_date()
    path = result_path(opts, traffic, model_id, date)
    data = result_json(requests, opts, traffic, model_id, goodput, date)
    flag = "--result-dir" if opts.result_dir else "--result-filename"
    try:
        earlier = _appendable(path, flag) if opts.append_result else ""
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_text(path, earlier + ("\n" if earlier else "") + json.dumps(data))
    except OSError as exc:
        raise InputError(f"cannot write the result file ({exc.strerror or exc})", path=str(path),
                         field=flag, allowed="a writable folder and file name") from None
    return path


def check_append_target(opts: BenchResultOptions) -> None:
    """Before the run: a named file --append-result would refuse is refused now (a name left to
    vLLM's pattern holds the date of writing, known only then)."""
    if opts.append_result and opts.result_filename:
        base = Path(opts.result_dir).expanduser() if opts.result_dir else Path()
        _appendable(base / opts.result_filename, "--result-dir" if opts.result_dir else "--result-filename")


def _appendable(path: Path, flag: str) -> str:
    """The text of an earlier result file to append to ("" when there is none)."""
    if not path.exists() and not path.is_symlink():
        return ""
    if path.is_symlink() or not path.is_file():
        raise InputError("--append-result adds to a regular file; this is a link or not a file", path=str(path),
                         field=flag, allowed="a result file written by --save-result, or a new name")
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        try:
            ok = isinstance(json.loads(line), dict) if line.strip() else True
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"line {number} is not a result (a JSON object): appending would mix it into "
                             "something else", path=str(path), field="--append-result",
                             allowed="a result file written by --save-result / --append-result, or a new name")
    return text


__all__ = ["BenchResultOptions", "BenchTraffic", "DEFAULT_METRIC_PERCENTILES", "DEFAULT_PERCENTILE_METRICS",
           "parse_metadata", "parse_metric_percentiles", "parse_percentile_metrics", "result_json",
           "result_path", "write_result"]
