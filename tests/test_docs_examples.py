"""The worked examples of docs/ARCHITECTURE.md ("Adding a pluggable kind"), run once each.

Each block between a 'doc example' marker comment and its 'end' marker is the snippet the doc shows (the doc copies
it verbatim); the test registers it, exercises it once, and unregisters it so nothing leaks into
other tests. Keep this fast (no simulation runs)."""

from __future__ import annotations

import pytest

from servesim.scheduler.registry import Registry


@pytest.fixture
def restore_registries():
    """Snapshot every Registry's entries and restore them afterwards."""
    regs = []

    def keep(reg: Registry):
        reg.names()  # run its loader first, so the built-ins are in the snapshot
        regs.append((reg, dict(reg._entries)))

    yield keep
    for reg, entries in regs:
        reg._entries.clear()
        reg._entries.update(entries)


def test_cost_model_example(restore_registries):
    from servesim.simulator.cost_model.base import COST_MODELS
    restore_registries(COST_MODELS)
    # --- doc example: cost model
    from servesim.simulator.cost_model import make_cost_model, register_cost_model
    from servesim.simulator.cost_model.base import StepShape

    @register_cost_model("per_token")
    class PerTokenCost:
        """Step time = fixed launch cost + a constant per token (a toy)."""

        name = "per_token"

        def __init__(self, model=None, gpu=None, tp=None, base_s=2e-3, per_token_s=5e-6):
            self.base_s, self.per_token_s = base_s, per_token_s

        def step_time_s(self, shape: StepShape) -> float:
            return self.base_s + self.per_token_s * shape.num_tokens
    # --- end
    cm = make_cost_model("per_token", model="llama-3.1-8b", gpu="h100", per_token_s=1e-6)
    t = cm.step_time_s(StepShape(num_new_tokens=(100, 1), num_context_tokens=(0, 50), num_sampled=2))
    assert t == pytest.approx(2e-3 + 101e-6)


def test_trace_format_example(restore_registries, tmp_path):
    from servesim.traces.registry import FORMATS
    restore_registries(FORMATS)
    # --- doc example: trace format
    import json

    from servesim.traces.registry import register_format
    from servesim.traces.workload import RequestSpec, Workload

    @register_format("tiny_jsonl", signatures=(("t", "in", "out"),), encodings=("jsonl",))
    def load_tiny(path, **options) -> Workload:
        """One JSON object per line: {"t": seconds, "in": prompt tokens, "out": output tokens}."""
        rows = [json.loads(line) for line in open(path) if line.strip()]
        specs = [RequestSpec(request_id=str(i), arrival_time_s=float(r["t"]),
                             prompt_len=int(r["in"]), output_len=int(r["out"]))
                 for i, r in enumerate(rows)]
        return Workload.from_unsorted(specs, name=path.stem, source=f"tiny_jsonl: {path}")
    # --- end
    from servesim.traces import load_workload

    f = tmp_path / "t.jsonl"
    f.write_text('{"t": 0.5, "in": 10, "out": 3}\n{"t": 0.0, "in": 7, "out": 2}\n')
    w = load_workload(f, fmt="tiny_jsonl")
    assert [r.prompt_len for r in w.requests] == [7, 10]


def test_router_example(restore_registries):
    from servesim.simulator.cluster.routers import ROUTERS
    restore_registries(ROUTERS)
    # --- doc example: router
    from servesim.simulator.cluster.routers import Decision, Router, register_router

    @register_router("shortest_queue_last")
    class ShortestQueueLast(Router):
        """Fewest outstanding requests; ties go to the LAST replica (a toy)."""

        def __init__(self, rng=None):
            self.rng = rng

        def choose(self, spec, candidates, now_s) -> Decision:
            loads = [c.engine.num_outstanding for c in candidates]
            best = min(range(len(loads)), key=lambda i: (loads[i], -i))
            return Decision(candidate=best, reason="shortest_queue_last", score=loads[best])
    # --- end
    from servesim.simulator.cluster.routers import make_router

    from types import SimpleNamespace as NS

    replicas = [NS(engine=NS(num_outstanding=n)) for n in (1, 0, 0)]
    assert make_router("shortest_queue_last").choose(None, replicas, 0.0).candidate == 2


def test_engine_example(restore_registries):
    from servesim.simulator.scheduler_kinds import ENGINES
    restore_registries(ENGINES)
    # --- doc example: engine
    from servesim.scheduler.async_scheduler import make_scheduler
    from servesim.simulator.scheduler_kinds import register_engine

    @register_engine("vllm_small_budget")
    def _small_budget(scheduler_config, cache_config, sim_config=None):
        """vLLM's scheduler with the token budget halved (a toy third engine)."""
        import dataclasses
        half = max(1, scheduler_config.max_num_batched_tokens // 2)
        return make_scheduler(dataclasses.replace(scheduler_config, max_num_batched_tokens=half),
                              cache_config)
    # --- end
    from servesim.scheduler.config import CacheConfig, SchedulerConfig
    from servesim.scheduler.interface import SchedulerInterface
    from servesim.simulator.scheduler_kinds import make_engine_scheduler

    sc = SchedulerConfig()
    s = make_engine_scheduler("vllm_small_budget", sc, CacheConfig())
    assert isinstance(s, SchedulerInterface)


def test_backend_example(restore_registries, tmp_path):
    from servesim.scenario.backends import BACKENDS
    restore_registries(BACKENDS)
    # --- doc example: sweep backend
    from servesim.scenario.backends import register_backend
    from servesim.scenario.task import execute

    @register_backend("serial_reversed")
    def run_reversed(tasks, root, workers, address, done):
        """Run the variants in this process, last first (a toy)."""
        for task in reversed(tasks):
            task.root = str(root)
            done(execute(task))
    # --- end
    from servesim.scenario.backends import get_backend

    seen = []
    get_backend("serial_reversed")([], tmp_path, None, None, seen.append)
    assert seen == []


def test_generator_example(restore_registries):
    from servesim.traces.synthetic import GENERATORS
    restore_registries(GENERATORS)
    # --- doc example: synthetic generator
    import dataclasses

    from servesim.traces.synthetic import SyntheticConfig, register_generator

    @register_generator("short_prompts", "every prompt capped at 256 tokens")
    def _short(config: SyntheticConfig) -> SyntheticConfig:
        cap = min(config.prompt_len.max_value or 256, 256)
        return dataclasses.replace(config, prompt_len=dataclasses.replace(config.prompt_len, max_value=cap))
    # --- end
    cfg = SyntheticConfig()
    out = GENERATORS.get("short_prompts").prepare(cfg)
    assert out.prompt_len.max_value == 256


def test_importer_example(restore_registries, tmp_path):
    from servesim.simulator.cost_model.importers import IMPORTERS
    restore_registries(IMPORTERS)
    # --- doc example: profile importer
    import pandas as pd

    from servesim.simulator.cost_model.importers import register_importer

    @register_importer("mylab", lambda p: p.name.endswith(".mylab.csv"))
    def import_mylab(path) -> pd.DataFrame:
        """Our lab's CSV (columns: op, tokens, us) -> the profile_schema table."""
        raw = pd.read_csv(path)
        return pd.DataFrame({"op": raw["op"], "num_tokens": raw["tokens"], "latency_s": raw["us"] * 1e-6})
    # --- end
    from servesim.simulator.cost_model.importers import detect_source

    f = tmp_path / "x.mylab.csv"
    f.write_text("op,tokens,us\nmlp,128,50\n")
    assert detect_source(f) == "mylab"
    df = IMPORTERS.get("mylab")[0](f)
    assert df["latency_s"].iloc[0] == pytest.approx(50e-6)


def test_run_format_example(restore_registries, tmp_path):
    from servesim.simulator.validation.runs import RUN_FORMATS
    restore_registries(RUN_FORMATS)
    # --- doc example: measured-run format
    from servesim.simulator.validation import register_run_format

    @register_run_format("doc_mylab_run", lambda p: (p / "mylab_run.json").is_file())
    def load_mylab_run(path):
        """Build a MeasuredRun (settings + per-request latencies) from our lab's folder."""
        ...  # see simulator/validation/runs.py::load_servesim_run for a complete loader
        return ("loaded", path.name)
    # --- end
    from servesim.simulator.validation.runs import detect_run_format, load_run

    (tmp_path / "mylab_run.json").write_text("{}")
    assert detect_run_format(tmp_path) == "doc_mylab_run"
    assert load_run(tmp_path) == ("loaded", tmp_path.name)


def test_metric_example(restore_registries):
    import numpy as np

    from servesim.simulator.columns import Columns
    from servesim.simulator.summary_metrics import METRICS
    restore_registries(METRICS)
    # --- doc example: metric
    from servesim.simulator.metrics import stats
    from servesim.simulator.summary_metrics import register_metric

    @register_metric("queueing_share")
    def queueing_share(requests, steps, sim_duration_s):
        """The share of each request's end-to-end latency spent waiting in the queue."""
        return stats(requests["queueing_s"] / requests["e2e_s"])
    # --- end
    from servesim.simulator.summary_metrics import compute_metrics

    requests = Columns({"queueing_s": np.array([0.5, 0.0]), "e2e_s": np.array([2.0, 1.0]),
                        "output_len": np.array([4, 2])})
    out = compute_metrics(requests, Columns({}), 3.0)
    assert out["queueing_share"]["mean"] == pytest.approx(0.125) and out["queueing_share"]["count"] == 2
    assert out["normalized_latency_s"]["mean"] == pytest.approx(0.5)  # the built-in is there too


def test_policy_example_is_tested_elsewhere():
    # The queue-policy worked example (shortest_prompt_first) lives in tests/test_sched_policies.py.
    import pathlib
    text = pathlib.Path(__file__).with_name("test_sched_policies.py").read_text()
    assert "shortest_prompt_first" in text


def test_doc_snippets_match_this_file():
    """Every doc-example block above appears verbatim (dedented) in docs/ARCHITECTURE.md."""
    import pathlib
    import re
    import textwrap

    here = pathlib.Path(__file__).read_text()
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    blocks = re.findall(r"# --- doc example: ([^\n]+)\n(.*?)\n\s*# --- end", here, re.S)
    assert len(blocks) == 9
    for kind, body in blocks:
        assert textwrap.dedent(body).strip() in doc, f"doc example {kind!r} differs from the test"
