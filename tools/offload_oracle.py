"""Drive the real vLLM 0.19.1 scheduler with the real OffloadingConnector (CPU KV tier) as an oracle.

    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/offload_oracle.py \
        --oracle-dir ../shared/tools/vllm_oracle --cpu-blocks 64 --offload-block-size 32 \
        --eviction-policy lru --load-steps 2 --store-steps 2 -- \
        --num-blocks 120 --num-requests 150 --out trace.jsonl --workload-out workload.jsonl

Everything after `--` goes to the shared oracle driver (drive.py: workload, fake model runner, trace
schema), imported, not copied. This file changes three things around it:

- the scheduler is built with `KVTransferConfig(kv_connector="OffloadingConnector")` and the extra
  config vLLM's `--kv-offloading-size` produces (`cpu_bytes_to_use`), plus `block_size` (offload
  block size) and `eviction_policy`; `cpu_bytes_to_use` is set to exactly `--cpu-blocks` offload
  blocks (CPUOffloadingSpec: num_blocks = cpu_bytes_to_use // (page_size_bytes * num_kv_tensors *
  world_size * block_size_factor)); the KV cache config gets one KV tensor so that size is not 0;
- a fake worker plays OffloadingConnectorWorker (vllm/distributed/kv_transfer/kv_connector/v1/
  offloading/worker.py) with transfers that take a set number of engine steps (`FakeOffloadWorker`);
- each trace line gets the connector's decisions of its schedule() and the worker's report of its
  execution: `offload_load` / `offload_store` {req_id: {"gpu": [...], "cpu": [...]}} (the
  OffloadingConnectorMetadata's reqs_to_load / reqs_to_store as GPU and CPU block ids),
  `offload_flush` (reqs_to_flush, sorted), `offload_finished_sending` / `offload_finished_recving`
  (sorted ids in this step's KVConnectorOutput).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

# The oracle's FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, float32): K and V.
def page_size_bytes(block_size: int) -> int:
    return 2 * block_size * 1 * 1 * 4


class FakeOffloadWorker:
    """OffloadingConnectorWorker's job bookkeeping with timed transfers: a load submitted in
    execution n completes in execution n + load_steps (seen by that execution's get_finished);
    a store prepared in execution n (wait_for_save, submitted at the start of n + 1) completes in
    execution n + store_steps; handle_preemptions waits for every store of a flushed request, so
    those complete in the execution that flushes them. finished_sending names a request only once it
    finished and has no store job left (as the real worker)."""

    def __init__(self, load_steps: int, store_steps: int):
        self.load_steps, self.store_steps = load_steps, store_steps
        self.exec_idx = -1
        self.job_counter = 0
        self.jobs: dict[int, tuple[str, bool, int]] = {}  # job -> (req, is_store, done execution)
        self.load_job: dict[str, int] = {}
        self.store_jobs: dict[str, set[int]] = defaultdict(set)
        self.finished_waiting_for_store: set[str] = set()

    def _new_job(self, req_id: str, store: bool, done: int) -> int:
        job = self.job_counter
        self.job_counter += 1
        self.jobs[job] = (req_id, store, done)
        return job

    def execute(self, so) -> tuple[set[str], set[str]]:
        self.exec_idx += 1
        n = self.exec_idx
        meta = so.kv_connector_metadata
        for rid in meta.reqs_to_flush or ():  # handle_preemptions: wait for the request's stores
            for job in self.store_jobs.get(rid, ()):
                r, s, _ = self.jobs[job]
                self.jobs[job] = (r, s, n)
        for rid in meta.reqs_to_load:  # start_kv_transfers
            assert rid not in self.load_job
            self.load_job[rid] = self._new_job(rid, False, n + self.load_steps)
        if so.total_num_scheduled_tokens > 0:  # wait_for_save -> prepare_store_kv (forward only)
            for rid in meta.reqs_to_store:
                self.store_jobs[rid].add(self._new_job(rid, True, n + self.store_steps))
        return self._get_finished(so.finished_req_ids)

    def _get_finished(self, finished_req_ids) -> tuple[set[str], set[str]]:
        sending, recving = set(), set()
        for job in sorted(j for j, (_, _, done) in self.jobs.items() if done <= self.exec_idx):
            rid, store, _ = self.jobs.pop(job)
            if store:
                req_jobs = self.store_jobs[rid]
                req_jobs.remove(job)
                if req_jobs:
                    continue
                if rid in self.finished_waiting_for_store:
                    self.finished_waiting_for_store.remove(rid)
                    sending.add(rid)
                    del self.store_jobs[rid]
            else:
                assert self.load_job.pop(rid) == job
                recving.add(rid)
        for rid in finished_req_ids:
            pending = self.store_jobs.get(rid)
            if pending:
                self.finished_waiting_for_store.add(rid)
            elif pending is not None:
                sending.add(rid)
                del self.store_jobs[rid]
        return sending, recving


def spec_record(specs: dict, gpu_first: bool) -> dict:
    """{req_id: {"gpu": ids, "cpu": ids}} from {req_id: (src_spec, dst_spec)}."""
    out = {}
    for rid, (src, dst) in specs.items():
        gpu, cpu = (src, dst) if gpu_first else (dst, src)
        out[rid] = {"gpu": [int(b) for b in gpu.block_ids], "cpu": [int(b) for b in cpu.block_ids]}
    return out


class OffloadScheduler:
    """The real scheduler with the fake worker between schedule() and update_from_output()."""

    def __init__(self, sched, worker: FakeOffloadWorker):
        self._sched, self._worker = sched, worker
        self.records: list[dict] = []  # one per schedule(), in order (= the trace's line order)
        self._pending: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._sched, name)

    def schedule(self):
        so = self._sched.schedule()
        meta = so.kv_connector_metadata
        rec = {"offload_load": spec_record(meta.reqs_to_load, gpu_first=False),
               "offload_store": spec_record(meta.reqs_to_store, gpu_first=True),
               "offload_flush": sorted(meta.reqs_to_flush or ())}
        self.records.append(rec)
        self._pending.append(rec)
        return so

    def update_from_output(self, so, mro):
        from vllm.v1.outputs import KVConnectorOutput

        rec = self._pending.pop(0)
        sending, recving = self._worker.execute(so)
        rec["offload_finished_sending"] = sorted(sending)
        rec["offload_finished_recving"] = sorted(recving)
        if sending or recving:
            mro.kv_connector_output = KVConnectorOutput(finished_sending=sending or None,
                                                        finished_recving=recving or None)
        return self._sched.update_from_output(so, mro)


@contextlib.contextmanager
def offloading_configs(args):
    """VllmConfig gets the OffloadingConnector; KVCacheConfig one KV tensor (CPUOffloadingSpec
    sizes the CPU tier from the tensors' bytes)."""
    import vllm.config as vc
    import vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector  # noqa: F401 -- before the patch
    import vllm.v1.kv_cache_interface as kci
    import vllm.v1.kv_offload.cpu.spec  # noqa: F401

    real_vllm, real_kvc = vc.VllmConfig, kci.KVCacheConfig
    factor = args.offload_block_size // args.gpu_block_size
    cpu_bytes = args.cpu_blocks * page_size_bytes(args.gpu_block_size) * factor

    def vllm_config(**kw):
        extra = {"cpu_bytes_to_use": cpu_bytes, "block_size": args.offload_block_size,
                 "eviction_policy": args.eviction_policy}
        kw["kv_transfer_config"] = vc.KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                       kv_connector_extra_config=extra)
        return real_vllm(**kw)

    def kv_cache_config(num_blocks, kv_cache_tensors, kv_cache_groups):
        tensors = [kci.KVCacheTensor(size=num_blocks * page_size_bytes(args.gpu_block_size), shared_by=["layer"])]
        return real_kvc(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv_cache_groups)

    vc.VllmConfig, kci.KVCacheConfig = vllm_config, kv_cache_config
    try:
        yield
    finally:
        vc.VllmConfig, kci.KVCacheConfig = real_vllm, real_kvc


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--oracle-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                        "tools", "vllm_oracle"))
    p.add_argument("--cpu-blocks", type=int, required=True, help="CPU tier size in offload blocks")
    p.add_argument("--offload-block-size", type=int, default=0, help="tokens; 0 = the GPU block size")
    p.add_argument("--eviction-policy", choices=["lru", "arc"], default="lru")
    p.add_argument("--load-steps", type=int, default=2)
    p.add_argument("--store-steps", type=int, default=2)
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    args = p.parse_args(own)
    if args.load_steps < 0 or args.store_steps < 1:
        p.error("--load-steps must be >= 0 and --store-steps >= 1")
    return args, rest


def run(args, drive_argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import drive  # the shared oracle driver

    dargs = drive.parse_args(drive_argv)
    args.gpu_block_size = dargs.block_size
    if args.offload_block_size == 0:
        args.offload_block_size = dargs.block_size
    holder: list[OffloadScheduler] = []
    real_build = drive.build_scheduler

    def build(dargs_):
        with offloading_configs(args):
            sched, cfg = real_build(dargs_)
        holder.append(OffloadScheduler(sched, FakeOffloadWorker(args.load_steps, args.store_steps)))
        return holder[0], cfg

    drive.build_scheduler = build
    try:
        rc = drive.main(drive_argv)
    finally:
        drive.build_scheduler = real_build
    with open(dargs.out) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    records = holder[0].records
    assert len(lines) == len(records), (len(lines), len(records))
    with open(dargs.out, "w") as f:
        for line, rec in zip(lines, records):
            line.update(rec)
            f.write(json.dumps(line) + "\n")
    return rc


# Golden configs (tests/golden/offload_*/): a GPU pool small enough that prefixes leave it and
# come back through the CPU tier, and a CPU tier small enough to evict.
_BASE = ["--num-requests", "150", "--num-prefixes", "6", "--arrival-spread", "120", "--num-blocks", "120"]
GOLDEN = {
    "offload_lru": (["--cpu-blocks", "48", "--offload-block-size", "32", "--eviction-policy", "lru"], _BASE),
    "offload_arc": (["--cpu-blocks", "48", "--offload-block-size", "32", "--eviction-policy", "arc"], _BASE),
    "offload_lru_async": (["--cpu-blocks", "64", "--offload-block-size", "32", "--eviction-policy", "lru",
                           "--load-steps", "3", "--store-steps", "1"], _BASE + ["--async-scheduling"]),
    "offload_arc_async_aborts": (["--cpu-blocks", "40", "--offload-block-size", "48", "--eviction-policy", "arc",
                                  "--load-steps", "4", "--store-steps", "2"],
                                 _BASE + ["--async-scheduling", "--abort-rate", "0.2", "--abort-window", "40",
                                          "--abort-preempted-rate", "0.3"]),
    "offload_block16_lru_aborts": (["--cpu-blocks", "100", "--eviction-policy", "lru", "--load-steps", "0",
                                    "--store-steps", "3"],
                                   _BASE + ["--abort-rate", "0.25", "--abort-window", "30", "--seed", "1"]),
}


def record(out_dir: str, oracle_dir: str) -> int:
    """Write OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json} for every GOLDEN config."""
    import gzip
    import shutil

    for name, (own, drive_argv) in GOLDEN.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        trace = os.path.join(d, "trace.jsonl")
        argv = ["--oracle-dir", oracle_dir, *own, "--", *drive_argv, "--out", trace,
                "--workload-out", os.path.join(d, "workload.jsonl")]
        args, rest = parse_args(argv)
        run(args, rest)
        with open(trace, "rb") as fi, gzip.GzipFile(trace + ".gz", "wb", mtime=0) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(trace)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"oracle": "vllm 0.19.1 OffloadingConnector (tools/offload_oracle.py)",
                       "offload_flags": own, "drive_flags": drive_argv}, f, indent=1)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--record":  # --record OUT_DIR [ORACLE_DIR]
        return record(argv[1], argv[2] if len(argv) > 2 else parse_args(["--cpu-blocks", "1"])[0].oracle_dir)
    args, rest = parse_args(argv)
    return run(args, rest)


if __name__ == "__main__":
    sys.exit(main())
