"""The fast path: planners that apply runs of engine steps at once, exactly as stepping would.

It plugs into the reference engine through one contract, simulator/run_planner.py's `RunPlanner`;
the engine never imports this package, and an engine without a planner is the complete, slower
simulator. `planner_for(engine)` builds the planner for an engine, or says why there is none (the
run's summary records it): a feature with no bulk support declines here, it never answers wrong.

    planner.py   MacroPlanner: proves and plans runs of plain decode steps (exact macro-steps)
    run_length.py  PlanGate: whether a loop top attempts a run (backs off while attempts fail)
    timeline.py  RunClock: a run's prices and times, with the stepping loop's float arithmetic
    runs.py      RunApplier: applies a planned run to the engine, the scheduler and the executor
    through.py   runs through finishes (the batch shrinks as requests finish inside the run)
    deferred.py  a cluster replica's runs applied when a request is routed to it
    router_proofs.py  what each router proves about where the coming arrivals go
    spec_runs.py SpecPlanner: runs of speculative-decoding verify steps (vLLM engines)

The scheduler's side of a run is its bulk owner (the scheduler's bulk decode path), which only
this package uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler.bulk import decode_runs_for
from servesim.simulator.engine import Engine
from servesim.simulator.executor import SimExecutor
from servesim.simulator.gateway.wiring import GATEWAY_DECLINED
from servesim.simulator.run_planner import RunPlanner
from servesim.simulator.sessions import TURNS_DECLINED
from servesim.simulator.structured_output import workload_needs_grammar


# The API server's one event loop (simulator/frontend.py) delivers each step's tokens when it has
# worked through every job queued before them, intakes included: a run applied at once cannot
# prove those delivery times (nor the client slots they free), so such runs step.
FRONTEND_LOOP_DECLINED = ("the frontend's serial event loop: each step's delivery time depends on the loop's "
                          "queue of intakes and earlier steps' outputs")


# A request waiting for its grammar becomes schedulable when the compile ends, a time no run's
# proof looks at (as an arrival would be): runs could admit it late.
GRAMMAR_DECLINED = "structured output: grammar compiles end at times of their own that a run's steps do not see"


# A session's next input chunk arrives at a time of its own, and its chunk ends are not finishes.
SESSIONS_DECLINED = "streaming input: a session's chunks arrive at times of their own and its chunk ends finish nothing"


# Multimodal requests: the encoder budget and cache are not part of the bulk decode path's proof (a
# run is planned only for plain decode steps, which encode nothing, but that is not proven here).
MULTIMODAL_DECLINED = "multimodal requests: the encoder budget and encoder cache are stepped, not planned"


@dataclass(slots=True, frozen=True)
class PlannerChoice:
    planner: RunPlanner | None
    declined: str | None  # why there is no planner (None when there is one)


def planner_for(engine: Engine) -> PlannerChoice:
    """The fast path for `engine` (built, not started), or why it has none."""
    cfg, sched, executor = engine.cfg, engine.scheduler, engine.executor
    why: str | None = None
    # the bulk decode path the scheduler declares (SchedulerCapabilities.decode_runs), not told by its type
    runs = decode_runs_for(sched) if cfg.macro_steps else None
    if not cfg.macro_steps:
        why = "macro_steps is off"
    elif engine.gateway is not None:
        why = GATEWAY_DECLINED
    elif runs is None:
        why = (f"scheduler {type(sched).__name__} declares no bulk decode path "
               "(P/D and other schedulers that change what a step does step)")
    elif engine.grammar_times.may_block or (engine.workload is not None and workload_needs_grammar(
            cfg.structured_output, engine.workload.columns)):
        why = GRAMMAR_DECLINED
    elif engine.turns is not None:
        why = TURNS_DECLINED
    elif engine.workload is not None and engine.workload.columns.any_set("input_chunk_offsets_s"):
        why = SESSIONS_DECLINED
    elif engine.workload is not None and engine.workload.columns.any_set("mm_items"):
        why = MULTIMODAL_DECLINED
    elif engine.kv_offload is not None:
        why = "the CPU KV tier (kv_offload): its copies land at times each step's end is compared with"
    elif cfg.hardware.pp > 1:
        why = "pipeline parallelism: a batch per stage in flight, timed stage by stage"
    elif not isinstance(executor, SimExecutor):
        why = "the executor is not the simulated one (GPU runner: every step runs the model)"
    elif engine.book.step_trace is not None:
        why = "a step trace records every step"
    elif engine.clients.loop is not None:
        why = FRONTEND_LOOP_DECLINED
    else:
        why = runs.decode_run_blocker()
    if why is None and cfg.scheduler.num_spec_tokens:  # verify steps: fastpath/spec_runs.py
        return _spec_choice(engine, runs, executor)
    if why is not None:
        return PlannerChoice(None, why)
    assert runs is not None
    from servesim.simulator.fastpath.planner import MacroPlanner
    assert isinstance(executor, SimExecutor)
    return PlannerChoice(MacroPlanner(engine, runs, executor), None)


SPEC_DECLINED = "speculative decoding: acceptance draws change the batch's token counts step by step"


def _spec_choice(engine: Engine, runs: object, executor: object) -> PlannerChoice:
    """The spec-decode planner for a vLLM engine; other schedulers' bulk paths replay no verify steps."""
    from servesim.scheduler.bulk.vllm import VllmDecodeRuns
    from servesim.simulator.fastpath.spec_runs import spec_planner_for

    if not isinstance(runs, VllmDecodeRuns) or not isinstance(executor, SimExecutor):
        return PlannerChoice(None, SPEC_DECLINED)
    planner, why = spec_planner_for(engine, executor)
    return PlannerChoice(planner, why)
