"""Drive the real vLLM 0.19.1 scheduler with the real OffloadingConnector (CPU KV tier) as an oracle.

    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/offload_oracle.py \
        --oracle-dir ../shared/tools/vllm_oracle --offload-cpu-blocks 64 --offload-block-size 32 \
        --offload-eviction-policy lru --offload-load-steps 2 --offload-store-steps 2 -- \
        --num-blocks 120 --num-requests 150 --out trace.jsonl --workload-out workload.jsonl
    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/offload_oracle.py --record tests/golden [ORACLE_DIR [NAME ...]]

Everything after `--` goes to the shared oracle driver (drive.py: workload, fake model runner, trace
schema), imported, not copied. This file changes three things around it:

- the scheduler is built with `KVTransferConfig(kv_connector="OffloadingConnector")` and the extra
  config vLLM's `--kv-offloading-size` produces (`cpu_bytes_to_use`), plus `block_size` (offload
  block size) and `eviction_policy`; `cpu_bytes_to_use` is set to exactly `--offload-cpu-blocks` offload
  blocks (CPUOffloadingSpec: num_blocks = cpu_bytes_to_use // (page_size_bytes * num_kv_tensors *
  world_size * block_size_factor)); the KV cache config gets one KV tensor so that size is not 0;
- a fake worker plays OffloadingConnectorWorker with transfers that take a set number of engine steps
  (scheduler/kv_offload/fake_worker.py, the same one the replay uses);
- each trace line gets the connector's decisions of its schedule() and the worker's report of its
  execution: `offload_load` / `offload_store` {req_id: {"gpu": [...], "cpu": [...]}} (the
  OffloadingConnectorMetadata's reqs_to_load / reqs_to_store as GPU and CPU block ids),
  `offload_flush` (reqs_to_flush, sorted), `offload_finished_sending` / `offload_finished_recving`
  (sorted ids in this step's KVConnectorOutput), and `offload_prefix_cache_stats` (the scheduler's
  connector_prefix_cache_stats of this update: the CPU tier's lookups and hits, in tokens).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import importlib.util

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

# The oracle's FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, float32): K and V.
def page_size_bytes(block_size: int) -> int:
    return 2 * block_size * 1 * 1 * 4


def _fake_worker_module():
    """scheduler/kv_offload/fake_worker.py, the one fake worker (imports nothing, so by path)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scheduler", "kv_offload", "fake_worker.py")
    spec = importlib.util.spec_from_file_location("servesim_fake_offload_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spec_record(specs: dict, gpu_first: bool) -> dict:
    """{req_id: {"gpu": ids, "cpu": ids}} from {req_id: (src_spec, dst_spec)}."""
    out = {}
    for rid, (src, dst) in specs.items():
        gpu, cpu = (src, dst) if gpu_first else (dst, src)
        out[rid] = {"gpu": [int(b) for b in gpu.block_ids], "cpu": [int(b) for b in cpu.block_ids]}
    return out


class OffloadScheduler:
    """The real scheduler with the fake worker between schedule() and update_from_output()."""

    def __init__(self, sched, worker):
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
            mro.kv_connector_output = KVConnectorOutput(finished_sending=set(sending) or None,
                                                        finished_recving=set(recving) or None)
        eco = self._sched.update_from_output(so, mro)
        stats = [outs.scheduler_stats for outs in eco.values() if outs.scheduler_stats is not None]
        ps = stats[0].connector_prefix_cache_stats if stats else None
        rec["offload_prefix_cache_stats"] = None if ps is None else {
            "requests": ps.requests, "queries": ps.queries, "hits": ps.hits,
            "preempted_requests": ps.preempted_requests, "preempted_queries": ps.preempted_queries,
            "preempted_hits": ps.preempted_hits}
        return eco


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
    cpu_bytes = args.offload_cpu_blocks * page_size_bytes(args.gpu_block_size) * factor

    def vllm_config(**kw):
        extra = {"cpu_bytes_to_use": cpu_bytes, "block_size": args.offload_block_size,
                 "eviction_policy": args.offload_eviction_policy}
        if args.offload_store_threshold:
            extra["store_threshold"] = args.offload_store_threshold
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
    p.add_argument("--offload-cpu-blocks", type=int, required=True, help="CPU tier size in offload blocks")
    p.add_argument("--offload-block-size", type=int, default=0, help="tokens; 0 = the GPU block size")
    p.add_argument("--offload-eviction-policy", choices=["lru", "arc"], default="lru")
    p.add_argument("--offload-store-threshold", type=int, default=0,
                   help="the extra config's store_threshold (>= 2: store only blocks looked up that often)")
    p.add_argument("--offload-load-steps", type=int, default=2)
    p.add_argument("--offload-store-steps", type=int, default=2)
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    args = p.parse_args(own)
    if args.offload_load_steps < 0 or args.offload_store_steps < 1:
        p.error("--offload-load-steps must be >= 0 and --offload-store-steps >= 1")
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
        worker = _fake_worker_module().FakeOffloadWorker(args.offload_load_steps, args.offload_store_steps)
        holder.append(OffloadScheduler(sched, worker))
        return holder[0], cfg

    from oracle_record import run_patched_drive

    return run_patched_drive(drive, drive_argv, {"build_scheduler": build}, dargs.out, lambda: holder[0].records)


# Golden configs (tests/golden/offload_*/): a GPU pool small enough that prefixes leave it and
# come back through the CPU tier, and a CPU tier small enough to evict. Flags by StepTraceConfig name.
_BASE = {"num_requests": 150, "num_prefixes": 6, "arrival_spread": 120, "num_blocks": 120}
GOLDEN = {
    "offload_lru": {"offload_cpu_blocks": 48, "offload_block_size": 32, **_BASE},
    "offload_arc": {"offload_cpu_blocks": 48, "offload_block_size": 32, "offload_eviction_policy": "arc", **_BASE},
    "offload_lru_async": {"offload_cpu_blocks": 64, "offload_block_size": 32, "offload_load_steps": 3,
                          "offload_store_steps": 1, "async_scheduling": True, **_BASE},
    "offload_arc_async_aborts": {"offload_cpu_blocks": 40, "offload_block_size": 48, "offload_eviction_policy": "arc",
                                 "offload_load_steps": 4, "offload_store_steps": 2, "async_scheduling": True,
                                 "abort_rate": 0.2, "abort_window": 40, "abort_preempted_rate": 0.3, **_BASE},
    "offload_block16_lru_aborts": {"offload_cpu_blocks": 100, "offload_load_steps": 0, "offload_store_steps": 3,
                                   "abort_rate": 0.25, "abort_window": 30, **_BASE, "seed": 1},
    # store_threshold 2 (vLLM's FilterReusedOffloadingManager): only blocks looked up twice are stored
    "offload_reuse2_lru": {"offload_cpu_blocks": 48, "offload_block_size": 32, "offload_store_threshold": 2, **_BASE},
    "offload_reuse3_arc_async": {"offload_cpu_blocks": 64, "offload_eviction_policy": "arc",
                                 "offload_store_threshold": 3, "offload_load_steps": 3, "offload_store_steps": 1,
                                 "async_scheduling": True, **_BASE, "seed": 2},
}


def record(out_dir: str, oracle_dir: str, only: tuple[str, ...] = ()) -> int:
    """Write OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json} for every GOLDEN config."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from oracle_record import record_goldens

    return record_goldens(out_dir, oracle_dir, GOLDEN, is_own=lambda k: k.startswith("offload_"),
                          parse_args=parse_args, run=run, only=only,
                          oracle="vllm 0.19.1 OffloadingConnector (tools/offload_oracle.py)")



def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--record":  # --record OUT_DIR [ORACLE_DIR [NAME ...]]: NAMEs only, when given
        oracle_dir = argv[2] if len(argv) > 2 else parse_args(["--offload-cpu-blocks", "1"])[0].oracle_dir
        return record(argv[1], oracle_dir, tuple(argv[3:]))
    args, rest = parse_args(argv)
    return run(args, rest)


if __name__ == "__main__":
    sys.exit(main())
