"""Drive the real vLLM 0.19.1 scheduler with blocked waits as an oracle: structured-output requests
waiting for their grammar (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR) and streaming-input sessions
(resumable requests, WAITING_FOR_STREAMING_REQ).

    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/blocked_oracle.py \
        --grammar-rate 0.4 --grammar-max-steps 6 --streaming-rate 0.3 -- \
        --num-requests 80 --out trace.jsonl --workload-out workload.jsonl
    /tmp/vllm-oracle-venv/bin/python tools/blocked_oracle.py --record tests/golden [ORACLE_DIR]

Everything after `--` goes to the shared oracle driver (drive.py: workload, fake model runner, trace
schema), imported, not copied. This file adds, around it (K = f"{seed}:{req_id}", crc/unit as drive.py):

- Grammar (`--grammar-rate P`, `--grammar-max-steps G`): a request with u(K:grammar) < P carries
  `grammar_steps = crc(K:grammar_steps) % (G + 1)`. Its Request gets a StructuredOutputRequest
  (regex params) whose grammar is an unresolved Future, so it starts in
  WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR as EngineCore leaves it after grammar_init; the future
  resolves (to a grammar accepting every token: the fake sampler's tokens are the model's, so the
  bitmask would allow them) right before the schedule() of step arrival_step + grammar_steps, i.e.
  grammar_steps schedule() calls after the add (a grammar-blocked request keeps every step busy).
  As vLLM's tests do it: no StructuredOutputManager backend, the Future set by hand.
- Streaming input (`--streaming-rate P`, `--stream-gap W`): a request (without a grammar) with
  u(K:stream) < P is a session (`stream: true`, resumable). 1 + crc(K:stream_n) % 3 more input
  chunks follow as extra workload lines with the same req_id (`stream_chunk: j`, a prompt of
  1 + crc(K:stream_len:j) % 48 tokens 100 + crc(K:stream_tok:j:i) % 8900, the session's max_tokens),
  chunk j arriving 1 + crc(K:stream_gap:j) % W steps after the previous line; then the close line
  (`stream_close: true`, prompt [0], not resumable: AsyncLLM's final request) 1 + crc(K:stream_close)
  % W steps later. Lines for a session that has already finished (an abort) are dropped, as
  AsyncLLM cancels the input stream of an aborted session.

Trace fields added after schedule() (only when the feature is on): `grammar_ready` (ids whose grammar
resolved before this schedule()), `has_structured_output_requests` and, async,
`pending_structured_output_tokens` (SchedulerOutput), `skipped_waiting` {req_id: status} after the
schedule (sorted ids), `stream_inputs` {req_id: "chunk" | "close" | "dropped"} for the session lines
added before it, `num_waiting_for_streaming_input` and `num_unfinished` (get_num_unfinished_requests).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")


class AcceptAllGrammar:
    """The compiled grammar's scheduler-side methods; every token is allowed."""

    def accept_tokens(self, request_id, tokens):
        return True

    def validate_tokens(self, tokens):
        return list(tokens)

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False

    def reset(self):
        pass


def add_blocked_fields(workload: list[dict], args, seed: int) -> list[dict]:
    """Grammar draws and streaming sessions' extra lines; returns the workload sorted by arrival."""
    from fake_model import crc, unit

    extra = []
    for w in workload:
        key = f"{seed}:{w['req_id']}"
        if args.streaming_rate > 0 and unit(f"{key}:stream") < args.streaming_rate:
            w["stream"] = True
            step = w["arrival_step"]
            for j in range(1, 2 + crc(f"{key}:stream_n") % 3):
                step += 1 + crc(f"{key}:stream_gap:{j}") % args.stream_gap
                n = 1 + crc(f"{key}:stream_len:{j}") % 48
                extra.append({"req_id": w["req_id"], "arrival_step": step, "max_tokens": w["max_tokens"],
                              "priority": w["priority"], "stream_chunk": j,
                              "prompt_token_ids": [100 + crc(f"{key}:stream_tok:{j}:{i}") % 8900 for i in range(n)]})
            step += 1 + crc(f"{key}:stream_close") % args.stream_gap
            extra.append({"req_id": w["req_id"], "arrival_step": step, "max_tokens": w["max_tokens"],
                          "priority": w["priority"], "stream_close": True, "prompt_token_ids": [0]})
        elif args.grammar_rate > 0 and unit(f"{key}:grammar") < args.grammar_rate:
            w["grammar_steps"] = crc(f"{key}:grammar_steps") % (args.grammar_max_steps + 1)
    out = workload + extra
    order = {id(w): i for i, w in enumerate(out)}
    return sorted(out, key=lambda w: (w["arrival_step"], w["req_id"], w.get("stream_chunk", 0),
                                      bool(w.get("stream_close")), order[id(w)]))


class BlockedScheduler:
    """The real scheduler with the grammar futures and the streaming lines' handling around it."""

    def __init__(self, sched, args):
        self._sched, self._args = sched, args
        self.records: list[dict] = []  # one per schedule(), in order (= the trace's line order)
        self._calls = 0  # schedule() calls so far
        self._due: dict[int, list] = {}  # schedule() call index -> [(req_id, future)]
        self._ready: list[str] = []
        self._stream_inputs: dict[str, str] = {}

    def __getattr__(self, name):
        return getattr(self._sched, name)

    def add_request(self, request):
        w = request._blocked_line  # set by the make_request wrapper
        rid = request.request_id
        if w.get("stream_chunk") or w.get("stream_close"):
            live = self._sched.requests.get(rid)
            if live is None or live.is_finished():
                self._stream_inputs[rid] = "dropped"
                return None
            self._stream_inputs[rid] = "close" if w.get("stream_close") else "chunk"
        elif "grammar_steps" in w:
            fut = request.structured_output_request._grammar  # the Future (the property polls it)
            self._due.setdefault(self._calls + w["grammar_steps"], []).append((rid, fut))
        return self._sched.add_request(request)

    def schedule(self):
        from vllm.v1.request import RequestStatus

        for call in sorted(c for c in self._due if c <= self._calls):
            for rid, fut in self._due.pop(call):
                fut.set_result(AcceptAllGrammar())
                req = self._sched.requests.get(rid)
                if req is not None and req.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                    self._ready.append(rid)
        self._calls += 1
        so = self._sched.schedule()
        s, args, rec = self._sched, self._args, {}
        if args.grammar_rate > 0:
            rec["grammar_ready"] = self._ready
            rec["has_structured_output_requests"] = bool(so.has_structured_output_requests)
            if args.async_scheduling:
                rec["pending_structured_output_tokens"] = bool(so.pending_structured_output_tokens)
        rec["skipped_waiting"] = {r.request_id: r.status.name
                                  for r in sorted(s.skipped_waiting, key=lambda r: r.request_id)}
        if args.streaming_rate > 0:
            rec["stream_inputs"] = self._stream_inputs
            rec["num_waiting_for_streaming_input"] = s.num_waiting_for_streaming_input
            rec["num_unfinished"] = s.get_num_unfinished_requests()
        self._ready, self._stream_inputs = [], {}
        self.records.append(rec)
        return so


def make_request_wrapper(real_make_request):
    """drive.make_request, plus the grammar future, the session flag and the close request."""
    from concurrent.futures import Future

    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import RequestStatus
    from vllm.v1.structured_output.request import StructuredOutputRequest

    def make(w, block_hasher, eos):
        req = real_make_request(w, block_hasher, eos)
        if w.get("stream") or w.get("stream_chunk"):
            req.resumable = True
        if "grammar_steps" in w:
            req.structured_output_request = StructuredOutputRequest(params=StructuredOutputsParams(regex="[a-z]+"))
            req.structured_output_request.grammar = Future()  # as grammar_init leaves it
            req.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        req._blocked_line = w
        return req

    return make


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--oracle-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                        "tools", "vllm_oracle"))
    p.add_argument("--grammar-rate", type=float, default=0.0)
    p.add_argument("--grammar-max-steps", type=int, default=6)
    p.add_argument("--streaming-rate", type=float, default=0.0)
    p.add_argument("--stream-gap", type=int, default=30)
    i = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:i])
    if args.grammar_max_steps < 0 or args.stream_gap < 1:
        p.error("--grammar-max-steps must be >= 0 and --stream-gap >= 1")
    return args, argv[i + 1:]


def run(args, drive_argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import drive  # the shared oracle driver

    dargs = drive.parse_args(drive_argv)
    args.async_scheduling = dargs.async_scheduling
    holder: list[BlockedScheduler] = []
    real = (drive.build_scheduler, drive.make_request, drive.gen_workload)

    def build(dargs_):
        sched, cfg = real[0](dargs_)
        holder.append(BlockedScheduler(sched, args))
        return holder[0], cfg

    def gen(dargs_):
        return add_blocked_fields(real[2](dargs_), args, dargs_.seed)

    from oracle_record import run_patched_drive

    patches = {"build_scheduler": build, "gen_workload": gen, "make_request": make_request_wrapper(real[1])}
    return run_patched_drive(drive, drive_argv, patches, dargs.out, lambda: holder[0].records)


# Golden configs (tests/golden/blocked_*/). Flags by StepTraceConfig name; `grammar_*` / `stream*`
# are this driver's own. Record with PYTHONHASHSEED=0 in the environment (set order of aborts).
# A small pool with many sessions deadlocks vLLM 0.19.1: sessions waiting (with a queued chunk or
# parked) keep their KV blocks, waiting requests are never preempted, and once they hold the pool
# no one can be admitted (seen with 200 blocks and streaming_rate 0.5); max_steps bounds such a run.
_BASE = {"num_requests": 80, "num_prefixes": 6, "arrival_spread": 60}
GOLDEN = {
    "blocked_grammar_fcfs": {"grammar_rate": 0.5, "grammar_max_steps": 6, **_BASE},
    "blocked_grammar_priority_small": {"grammar_rate": 0.6, "grammar_max_steps": 10, "policy": "priority",
                                       "num_blocks": 160, **_BASE},
    "blocked_grammar_async": {"grammar_rate": 0.5, "grammar_max_steps": 4, "async_scheduling": True, **_BASE},
    "blocked_grammar_async_priority_aborts": {"grammar_rate": 0.5, "grammar_max_steps": 8, "async_scheduling": True,
                                              "policy": "priority", "abort_rate": 0.3, "abort_window": 20, **_BASE},
    "blocked_streaming": {"streaming_rate": 0.4, "stream_gap": 30, **_BASE},
    "blocked_streaming_async_priority": {"streaming_rate": 0.4, "stream_gap": 20, "async_scheduling": True,
                                         "policy": "priority", **_BASE},
    "blocked_streaming_aborts": {"streaming_rate": 0.5, "stream_gap": 40, "abort_rate": 0.3,
                                 "abort_window": 80, "max_steps": 4000, **_BASE},
    # vLLM's deadlock (above): from step 636 nothing runs; the trace stops at max_steps.
    "blocked_streaming_aborts_deadlock": {"streaming_rate": 0.5, "stream_gap": 40, "abort_rate": 0.3,
                                          "abort_window": 80, "num_blocks": 500, "max_steps": 700, **_BASE},
    "blocked_mixed_async_aborts": {"grammar_rate": 0.4, "streaming_rate": 0.3, "stream_gap": 25,
                                   "async_scheduling": True, "abort_rate": 0.25, "abort_window": 40,
                                   "num_blocks": 500, "max_steps": 4000, **_BASE},
}
_OWN = ("grammar_rate", "grammar_max_steps", "streaming_rate", "stream_gap")


def record(out_dir: str, oracle_dir: str, names=None) -> int:
    """Write OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json} for each GOLDEN config."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from oracle_record import record_goldens

    return record_goldens(out_dir, oracle_dir, GOLDEN, is_own=lambda k: k in _OWN, parse_args=parse_args,
                          run=run, only=tuple(names or ()),
                          oracle="vllm 0.19.1 blocked waits (tools/blocked_oracle.py)")



def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--record":  # --record OUT_DIR [ORACLE_DIR [NAME ...]]
        oracle_dir = argv[2] if len(argv) > 2 else parse_args([])[0].oracle_dir
        return record(argv[1], oracle_dir, set(argv[3:]))
    return run(*parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
