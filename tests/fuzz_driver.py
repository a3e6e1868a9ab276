"""Liveness fuzz: random configurations and workloads through the simulated engine, both schedulers.

Every schedule() and update_from_output() is followed by the scheduler's check_invariants() and a
shadow-KV check (a running request's KV covers its computed tokens; a drained engine holds no KV);
every episode must end with each request completed, rejected or aborted as stranded (a request the
scheduler can never admit, which vLLM itself would wait on forever: docs/LIVENESS.md section 3), or
stop with the watchdog's StallError for the one stall vLLM itself has (the priority-tie preemption
livelock). Anything else (an invariant failure, a crash, an unexplained stall) is a finding.

    python tests/fuzz_driver.py --steps 1000000 --seed 1     # the long run (prints figures)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim.scheduler import CacheConfig, SchedulerConfig  # noqa: E402
from servesim.scheduler.async_scheduler import AsyncScheduler  # noqa: E402
from servesim.scheduler.scheduler import Scheduler  # noqa: E402
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler  # noqa: E402
from servesim.simulator.config import LivenessConfig, SimConfig, SpecDecodeConfig  # noqa: E402
from servesim.simulator.engine import Engine  # noqa: E402
from servesim.simulator.liveness import StallError  # noqa: E402
from servesim.simulator.scheduler_kinds.sglang import map_sglang_config  # noqa: E402
from servesim.simulator.startup import resolve_cache, resolved  # noqa: E402
from servesim.traces.errors import InputError  # noqa: E402
from servesim.traces.workload import RequestSpec, Workload  # noqa: E402

LIVELOCK = "preemptions since the last progress"


@dataclass(slots=True)
class Figures:
    episodes: int = 0
    steps: int = 0  # schedule() calls
    requests: int = 0
    completed: int = 0
    rejected: int = 0
    aborted: int = 0  # stranded requests the engine aborted (liveness.stranded_requests "abort")
    refused_configs: int = 0  # start-up checks refused the sampled config (counted, not run)
    livelocks: int = 0  # watchdog stops on vLLM's priority-tie livelock
    livelock_kinds: dict = field(default_factory=dict)  # (engine, policy, reserve_full_isl) -> count
    findings: list[str] = field(default_factory=list)


class _Counter:
    steps = 0


def _checked(base: type, counter: type[_Counter]) -> type:
    """base with check_invariants() and the shadow-KV check after every schedule and update."""

    def schedule(self, now_s=None):
        so = base.schedule(self, now_s=now_s)
        counter.steps += 1
        self.check_invariants()
        _shadow_kv(self)
        return so

    def update_from_output(self, so, mro, now_s=None):
        eco = base.update_from_output(self, so, mro, now_s=now_s)
        self.check_invariants()
        _shadow_kv(self)
        return eco

    return type(f"Checked{base.__name__}", (base,), {"schedule": schedule, "update_from_output": update_from_output})


def _shadow_kv(sched) -> None:
    """Recount what the KV must cover, independently of the scheduler's own bookkeeping."""
    if isinstance(sched, SGLangScheduler):
        return  # its check_invariants() already recounts pages per running request
    if sched.cache_config.attention != "full":
        return
    bs = sched.block_size
    blocks = sched.kv_cache_manager.coordinator.managers[0].req_to_blocks
    for r in sched.running:
        held = len(blocks.get(r.request_id, ()))
        if held * bs < r.num_computed_tokens:
            raise AssertionError(f"shadow KV: {r.request_id} holds {held} blocks for {r.num_computed_tokens} "
                                 f"computed tokens (block size {bs})")


def _drained(engine: Engine) -> None:
    sched = engine.scheduler
    if isinstance(sched, SGLangScheduler):
        if sched.kv_cache_manager.reqs:
            raise AssertionError(f"shadow KV: drained SGLang engine still holds KV for {list(sched.kv_cache_manager.reqs)[:3]}")
    elif not sched.policy.held_request_ids() and sched.kv_cache_manager.usage > 1e-12:
        raise AssertionError(f"shadow KV: drained engine has KV usage {sched.kv_cache_manager.usage}")


def _config(rng: np.random.Generator, engine: str) -> SimConfig:
    bs = int(rng.choice([1, 2, 4, 16]))
    num_blocks = int(rng.integers(8, 120))
    mml = int(rng.integers(max(8, bs), max(9, min(num_blocks * bs, 600)) + 1))
    max_num_seqs = int(rng.integers(1, 9))
    chunked = bool(rng.random() < 0.85)
    budget = int(rng.integers(max(max_num_seqs, bs if engine == "sglang" else 1), 96))
    if not chunked:
        budget = max(budget, mml)
    spec = engine == "vllm" and rng.random() < 0.2
    policy = str(rng.choice(["fcfs", "priority", "continuum"])) if engine == "vllm" else "fcfs"
    attention = str(rng.choice(["full", "full", "full", "sliding_window", "hybrid"])) if engine == "vllm" else "full"
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=mml, enable_chunked_prefill=chunked,
        long_prefill_token_threshold=int(rng.choice([0, 0, 3, 16])), policy=policy,
        async_scheduling=bool(rng.random() < 0.5), num_spec_tokens=2 if spec else 0,
        scheduler_reserve_full_isl=bool(rng.random() < 0.7),
        max_loras=int(rng.integers(1, 3)) if engine == "vllm" and rng.random() < 0.2 else None)
    cache = CacheConfig(block_size=bs, num_gpu_blocks=num_blocks, enable_prefix_caching=bool(rng.random() < 0.6),
                        attention=attention,
                        sliding_window=int(rng.integers(4, 64)) if attention != "full" else None)
    sglang = SGLangConfig(schedule_policy=str(rng.choice(["fcfs", "lpm", "lof", "random", "dfs-weight"])),
                          enable_mixed_chunk=bool(rng.random() < 0.3),
                          enable_priority_scheduling=bool(rng.random() < 0.3),
                          priority_scheduling_preemption_threshold=int(rng.integers(0, 3)))
    if not cache.enable_prefix_caching and sglang.schedule_policy in ("lpm", "dfs-weight"):
        sglang = SGLangConfig(schedule_policy="fcfs")
    return SimConfig(scheduler=sched, cache=cache, derive_num_gpu_blocks=False, engine=engine, sglang=sglang,
                     spec_decode=SpecDecodeConfig((0.7, 0.4) if spec else ()), seed=int(rng.integers(1 << 30)),
                     liveness=LivenessConfig(max_steps_without_progress=3000, max_sim_s_without_progress=600.0))


def _workload(rng: np.random.Generator, mml: int) -> Workload:
    n = int(rng.integers(1, 16))
    reqs, t = [], 0.0
    for i in range(n):
        if rng.random() < 0.6:  # ties on purpose: vLLM's priority ordering breaks them by arrival
            t += float(rng.exponential(0.05))
        prompt = int(rng.integers(1, mml + 2))  # a few reach or pass max_model_len: must be rejected
        group = int(rng.integers(0, 2)) if rng.random() < 0.5 else None  # shared prefixes: cache hits
        session = f"s{int(rng.integers(0, 3))}" if rng.random() < 0.3 else None  # Continuum jobs
        reqs.append(RequestSpec(f"q{i}", t, prompt, int(rng.integers(1, 40)), priority=int(rng.integers(0, 3)),
                                session_id=session, is_last_turn=bool(rng.random() < 0.5),
                                lora_id=int(rng.integers(1, 4)) if rng.random() < 0.2 else None,
                                prefix_group=group,
                                prefix_len=min(prompt - 1, int(rng.integers(0, 64))) if group is not None else 0))
    return Workload(reqs, "fuzz", "fuzz")


def _scheduler(cfg: SimConfig, counter: type[_Counter]):
    cfg = resolved(cfg)
    cache, _ = resolve_cache(cfg)
    if cfg.engine == "sglang":
        return _checked(SGLangScheduler, counter)(
            map_sglang_config(cfg.scheduler, cache, cfg.sglang, cfg.seed), cfg.scheduler.max_model_len)
    base = AsyncScheduler if cfg.scheduler.async_scheduling else Scheduler
    return _checked(base, counter)(cfg.scheduler, cache)


def episode(rng: np.random.Generator, figs: Figures) -> None:
    engine_name = "vllm" if rng.random() < 0.5 else "sglang"
    try:
        cfg = _config(rng, engine_name)
    except InputError:
        figs.refused_configs += 1
        return
    wl = _workload(rng, cfg.scheduler.max_model_len)
    counter = type("C", (_Counter,), {"steps": 0})
    figs.episodes += 1
    figs.requests += len(wl.requests)
    try:
        eng = Engine(cfg, wl, scheduler=_scheduler(cfg, counter))
        eng.run()
        _drained(eng)
        req = eng.metrics.requests_frame()
        figs.completed += int((req["status"] == "completed").sum())
        figs.rejected += int((req["status"] == "rejected").sum())
        figs.aborted += int((req["status"] == "aborted").sum())
        if int(req["status"].isna().sum()):
            figs.findings.append(f"{engine_name}: {int(req['status'].isna().sum())} requests neither done nor rejected")
    except StallError as e:
        livelock_cfg = (cfg.scheduler.policy == "priority" or cfg.sglang.enable_priority_scheduling) or \
            not cfg.scheduler.scheduler_reserve_full_isl
        if LIVELOCK in str(e) and livelock_cfg:
            figs.livelocks += 1
            kind = (engine_name, cfg.scheduler.policy if engine_name == "vllm" else
                    f"priority_scheduling={cfg.sglang.enable_priority_scheduling}",
                    f"reserve_full_isl={cfg.scheduler.scheduler_reserve_full_isl}")
            figs.livelock_kinds[kind] = figs.livelock_kinds.get(kind, 0) + 1
        else:
            figs.findings.append(f"{engine_name} stall: {e} :: {cfg}")
    except Exception as e:  # noqa: BLE001 - every crash is a finding, with the config to replay it
        figs.findings.append(f"{engine_name} {type(e).__name__}: {e} :: {cfg}")
    figs.steps += counter.steps


def fuzz(max_steps: int, seed: int) -> Figures:
    """Episodes until ``max_steps`` schedule() steps or the first finding: bounded by steps, never
    by wall time, so a seed is the same run on every machine."""
    rng = np.random.default_rng(seed)
    figs = Figures()
    while figs.steps < max_steps and not figs.findings:
        episode(rng, figs)
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report-every", type=int, default=50_000)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    figs, t0, next_report = Figures(), time.perf_counter(), args.report_every
    while figs.steps < args.steps:
        episode(rng, figs)
        if figs.findings:
            break
        if figs.steps >= next_report:
            next_report += args.report_every
            print(f"{figs.steps} steps, {figs.episodes} episodes, {time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    print(f"seed {args.seed}: {figs.steps} schedule() steps, {figs.episodes} episodes, {figs.requests} requests "
          f"({figs.completed} completed, {figs.rejected} rejected, {figs.aborted} aborted as stranded), {figs.refused_configs} configs refused at "
          f"start-up, {figs.livelocks} priority livelocks stopped by the watchdog, {len(figs.findings)} findings, "
          f"{wall:.0f} s wall")
    for kind, n in sorted(figs.livelock_kinds.items()):
        print("livelock:", ", ".join(kind), n)
    for f in figs.findings:
        print("FINDING:", f)
    sys.exit(1 if figs.findings else 0)


if __name__ == "__main__":
    main()
