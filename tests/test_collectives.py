"""Interconnect specs and collective costs (simulator/cost_model/collectives.py)."""

from pathlib import Path

import pytest

from servesim.simulator.cost_model import make_cost_model, prefill_shape
from servesim.simulator.cost_model.collectives import Collectives, custom_allreduce_max_bytes
from servesim.simulator.specs import default_host, resolve_gpu
from servesim.traces.errors import InputError

MIB = 2**20


@pytest.mark.parametrize("gpu", ["a100-80gb", "a100-pcie", "h100", "h100-pcie", "h200", "b200", "l40s",
                                 "rtx4090", "rtx-pro-6000"])
def test_required_gpus_have_interconnect_specs(gpu):
    h = default_host(gpu)  # the link belongs to the GPU's host
    assert h.gpu == resolve_gpu(gpu).name
    assert h.interconnect in ("nvlink", "pcie")
    assert h.pcie_gb_s > 0
    if h.interconnect == "pcie":
        assert h.interconnect_gb_s == pytest.approx(h.pcie_gb_s, rel=0.05)


def test_vllm_custom_allreduce_rule():
    h100, pcie, gef = resolve_gpu("h100"), resolve_gpu("h100-pcie"), resolve_gpu("rtx4090")
    assert custom_allreduce_max_bytes(h100, 2) == 8 * MIB  # min(8 MiB buffer, 64 MiB symm limit)
    assert custom_allreduce_max_bytes(h100, 8) == MIB // 4  # sm90 + symm mem, 8 GPUs
    assert custom_allreduce_max_bytes(resolve_gpu("b200"), 4) == 2 * MIB
    assert custom_allreduce_max_bytes(pcie, 2) == 8 * MIB  # a PCIe pair is allowed
    assert custom_allreduce_max_bytes(pcie, 4) == 0  # "not supported on more than two PCIe-only GPUs"
    assert custom_allreduce_max_bytes(gef, 2) == 0  # no P2P on GeForce
    assert custom_allreduce_max_bytes(h100, 3) == 0  # world sizes 2/4/6/8 only


def test_measured_tables_pick_custom_below_the_buffer_and_nccl_above():
    c = Collectives("rtx-pro-6000", 2)
    assert c.source.allreduce.startswith("measured")
    # aiconfigurator RTX PRO 6000 Server: custom graph 128 elem 4.27 us; NCCL 256 MiB (2^27 elem) 7.11 ms
    assert c.allreduce_s(256) == pytest.approx(4.27e-6, rel=0.05)
    assert c.allreduce_s(2**28) == pytest.approx(7.106e-3, rel=0.01)
    assert c.allreduce_s(8 * MIB) >= c.allreduce_s(8 * MIB - 1) * 0.9  # NCCL from the buffer size on


def test_pcie_allreduce_much_slower_than_nvlink():
    big = 16 * MIB
    assert Collectives("rtx-pro-6000", 2).allreduce_s(big) > 3 * Collectives("h100", 2).allreduce_s(big)
    # no table for H100 PCIe: bus-bandwidth model at PCIe gen5 x16
    model = Collectives("h100-pcie", 2)
    assert model.source.allreduce.startswith("model")
    assert model.allreduce_s(big) > 3 * Collectives("h100", 2).allreduce_s(big)


def test_roofline_uses_collectives_and_explicit_params_use_the_model():
    tabled = make_cost_model("roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=2)
    assert tabled.collectives.source.allreduce.startswith("measured")
    explicit = make_cost_model("roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=2,
                               interconnect_efficiency=0.5)
    assert explicit.collectives.source.allreduce.startswith("model")
    shape = prefill_shape(2048)
    assert tabled.breakdown(shape)["allreduce"] > 0
    one = make_cost_model("roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=1)
    assert one.breakdown(shape)["allreduce"] == 0


def test_alltoall_and_send_recv_positive():
    c = Collectives("h100", 8)
    assert c.alltoall_s(MIB) > 0 and c.send_recv_s(MIB) > c.send_recv_s(1)


NCCL_TESTS_OUT = """# nThread 1 nGpus 2 minBytes 1024 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid  41 on     node0 device  0 [0x17] NVIDIA RTX PRO 6000 Blackwell Workstation Edition
#  Rank  1 Group  0 Pid  41 on     node0 device  1 [0x65] NVIDIA RTX PRO 6000 Blackwell Workstation Edition
#
# Collective test starting: all_reduce_perf
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           512  bfloat16     sum      -1    20.10    0.05    0.05      0    19.80    0.05    0.05      0
     4194304       2097152  bfloat16     sum      -1   300.00   13.98   13.98      0   299.00   14.03   14.03      0
# Avg bus bandwidth    : 4.7
"""


def test_nccl_tests_output_is_an_allreduce_profile(tmp_path):
    from servesim.simulator.cost_model import import_profile

    path = tmp_path / "all_reduce.txt"
    path.write_text(NCCL_TESTS_OUT)
    df = import_profile("auto", path)
    assert list(df["op"].unique()) == ["allreduce"] and set(df["tp"]) == {2}
    assert df["gpu"].iloc[0] == "rtx-pro-6000"
    assert df["latency_s"].max() == pytest.approx(300e-6)


NCCL_TESTS_H100 = """# nThread 1 nGpus 2 minBytes 1024 maxBytes 268435456 step: 4(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid  41 on     node0 device  0 [0x17] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41 on     node0 device  1 [0x65] NVIDIA H100 80GB HBM3
#
# Collective test starting: all_reduce_perf
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           512  bfloat16     sum      -1    10.00    0.10    0.10      0     9.90    0.10    0.10      0
    16777216       8388608  bfloat16     sum      -1   200.00   83.89   83.89      0   199.00   84.31   84.31      0
   268435456     134217728  bfloat16     sum      -1  2000.00  134.22  134.22      0  1990.00  134.89  134.89      0
# Avg bus bandwidth    : 72.7
"""


def test_roofline_takes_this_hosts_allreduce_from_nccl_tests_output(tmp_path):
    """nccl-tests output as a profile source for the roofline's TP all-reduce: NCCL from the file,
    vLLM's custom all-reduce (below its buffer size) still from the shipped H100 tables."""
    from servesim.simulator.cost_model.collectives import custom_allreduce_max_bytes
    from servesim.simulator.specs import resolve_gpu

    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(NCCL_TESTS_H100)
    shipped = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=2)
    host = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=2, allreduce_profile=str(path))
    car = custom_allreduce_max_bytes(resolve_gpu("h100"), 2)
    assert 0 < car < 16 * MIB
    assert host.collectives.allreduce_s(16 * MIB) == pytest.approx(200e-6, rel=1e-12)
    assert host.collectives.allreduce_s(256 * MIB) == pytest.approx(2000e-6, rel=1e-12)
    assert host.collectives.allreduce_s(64 * 1024) == shipped.collectives.allreduce_s(64 * 1024)  # custom AR
    assert "this host" in host.collectives.source.allreduce
    with pytest.raises(InputError):  # the file measured 2 GPUs, not 4
        make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=4, allreduce_profile=str(path))


_AIC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpu_profiles" / "aiconfigurator"
_NCCL_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "b200": "b200_sxm",
                 "l40s": "l40s", "rtx-pro-6000": "rtx_pro_6000_server"}


@pytest.mark.skipif(not _AIC.is_dir(), reason="../shared not present")
@pytest.mark.parametrize("gpu", sorted(_NCCL_SYSTEMS))
def test_interconnect_efficiency_is_the_measured_bus_bandwidth(gpu):
    """Each spec's interconnect_efficiency is the bus bandwidth of the largest fp16 NCCL all-reduce
    on 2 GPUs in aiconfigurator's table, over the spec's link bandwidth (docs/COST_MODELS.md)."""
    import pandas as pd

    (table,) = (_AIC / _NCCL_SYSTEMS[gpu]).glob("nccl_*/nccl_perf.csv.gz")
    rows = pd.read_csv(table)
    rows = rows[(rows.op_name == "all_reduce") & (rows.num_gpus == 2) & (rows.nccl_dtype == "half")]
    big = rows[rows.message_size == rows.message_size.max()].iloc[0]
    # bus bandwidth = 2 (n - 1) / n x bytes / time, which is bytes / time at n = 2; fp16: 2 bytes each
    bus_gb_s = big.message_size * 2 / (big.latency * 1e-3) / 1e9
    spec = default_host(gpu)
    assert spec.interconnect_efficiency == pytest.approx(bus_gb_s / spec.interconnect_gb_s, abs=0.006)


def test_nccl_tests_output_of_every_collective_feeds_collectives_profile(tmp_path):
    """all_gather / reduce_scatter / alltoall / sendrecv _perf output, several tests in one file:
    each section's rows get its op, and collectives_profile prices those collectives from them."""
    from servesim.simulator.cost_model.importers.nccl_tests import import_nccl_tests

    head, rows = NCCL_TESTS_H100.split("# Collective test starting: all_reduce_perf\n")
    table = rows.split("# Avg")[0]
    text = head
    for i, test in enumerate(("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")):
        scaled = table.replace("10.00", f"{10 + i}.00").replace("200.00", f"{200 + i}.00")
        text += f"# Collective test starting: {test}_perf\n{scaled}"
    path = tmp_path / "host.txt"  # the file's name names no test: the section lines decide
    path.write_text(text)
    df = import_nccl_tests(path)
    assert list(df.groupby("op", sort=False).size().items()) == [
        ("allreduce", 3), ("allgather", 3), ("reducescatter", 3), ("alltoall", 3), ("sendrecv", 3)]
    cm = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=2, collectives_profile=str(path))
    c = cm.collectives
    assert c.allgather_s(16 * MIB) == pytest.approx(201e-6, rel=1e-12)
    assert c.reducescatter_s(16 * MIB) == pytest.approx(202e-6, rel=1e-12)
    assert c.alltoall_s(1024) == pytest.approx(13e-6, rel=1e-12)
    assert c.send_recv_s(1024) == pytest.approx(14e-6, rel=1e-12)
    assert c.allreduce_s(16 * MIB) == pytest.approx(200e-6, rel=1e-12)  # NCCL above the custom buffer
    unnamed = tmp_path / "unnamed.txt"
    unnamed.write_text(NCCL_TESTS_H100.replace("# Collective test starting: all_reduce_perf\n", ""))
    with pytest.raises(InputError, match="cannot tell which nccl-tests test"):
        import_nccl_tests(unnamed)
    named = tmp_path / "all_gather_perf.txt"
    named.write_text(NCCL_TESTS_H100.replace("# Collective test starting: all_reduce_perf\n", ""))
    assert set(import_nccl_tests(named)["op"]) == {"allgather"}
    other = tmp_path / "x.txt"
    other.write_text(NCCL_TESTS_H100.replace("all_reduce_perf", "broadcast_perf"))
    with pytest.raises(InputError, match="broadcast_perf output is not read"):
        import_nccl_tests(other)


def test_a_host_profile_prices_the_moe_dispatch_where_it_measured_the_group(tmp_path):
    """DP 2 x TP 1 with EP: the dispatch group is 2 GPUs, which the host measured; at DP 4 it
    is not, and the shipped tables price it (no error: the TP group itself was covered)."""
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile

    rows = [{"source": "servesim", "gpu": "h100", "op": op, "tp": 2, "bytes": b, "latency_s": 1e-3}
            for op in ("allgather", "reducescatter") for b in (1024, 2**30)]
    write_profile(make_profile(rows), tmp_path / "host.csv")
    kw = dict(model="qwen3-30b-a3b", gpu="h100", tp=1, expert_parallel_size=2, data_parallel_size=2)
    host = make_cost_model("roofline", collectives_profile=str(tmp_path / "host.csv"), **kw)
    assert "this host" in host.moe_comm_source
    assert "this host" not in make_cost_model("roofline", **kw).moe_comm_source
    kw.update(expert_parallel_size=4, data_parallel_size=4)
    assert "this host" not in make_cost_model("roofline", collectives_profile=str(tmp_path / "host.csv"),
                                              **kw).moe_comm_source
