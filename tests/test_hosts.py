"""Host specs (simulator/specs/hosts.py) and vLLM's all-reduce path on each host (collectives.py)."""

from dataclasses import replace

import pytest

from servesim.overrides import apply_overrides
from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model import make_cost_model, prefill_shape, run_cost_model
from servesim.simulator.cost_model.collectives import (
    Collectives,
    custom_allreduce_max_bytes,
    custom_allreduce_rule,
    measured_tables,
)
from servesim.simulator.cost_model.interp import Curve
from servesim.simulator.specs import available_gpus, available_hosts, default_host, host_for, resolve_gpu, resolve_host
from servesim.traces.errors import InputError

MIB = 2**20
WS, ACS_OFF, SERVER = "rtx-pro-6000-workstation", "rtx-pro-6000-pcie-acs-off", "rtx-pro-6000-server"


def test_every_gpu_has_a_default_host_of_its_own():
    for gpu in available_gpus():
        assert default_host(gpu).gpu == gpu
    for name in available_hosts():
        h = resolve_host(name)
        assert h.sources and resolve_gpu(h.gpu).name == h.gpu
        if h.collective_tables is not None:  # names an entry the shipped tables hold
            assert measured_tables(h, 2) is not None
    assert default_host("rtx-pro-6000").name == SERVER  # what rtx-pro-6000 priced before hosts


def test_host_names_aliases_and_did_you_mean():
    assert resolve_host("RTX_PRO_6000_Workstation").name == WS
    assert resolve_host("llmservingsim-rtxpro6000").name == WS
    with pytest.raises(InputError, match="did you mean 'rtx-pro-6000-workstation'") as e:
        resolve_host("rtx-pro-6000-workstaton")
    assert e.value.field == "host" and SERVER in e.value.allowed
    with pytest.raises(InputError, match="has rtx-pro-6000 GPUs, not h100") as e:
        host_for("h100", WS)
    assert e.value.allowed == "h100-hgx"
    assert host_for("rtxpro6000", None).name == SERVER


def test_host_spec_validation():
    good = resolve_host(WS)
    with pytest.raises(InputError, match="exactly one of bus_bandwidth_gb_s"):
        replace(good, interconnect_efficiency=0.5)  # a measured bus bandwidth and a link fraction
    with pytest.raises(InputError, match="exactly one"):
        replace(good, bus_bandwidth_gb_s=None)
    with pytest.raises(InputError, match="cites its sources"):
        replace(good, sources=())
    with pytest.raises(InputError, match="nvlink_generation"):
        replace(good, interconnect="nvlink")


def test_gpu_specs_refuse_link_fields(tmp_path, monkeypatch):
    """How the GPUs talk moved to hosts.yaml: an old gpus.yaml entry says where it goes."""
    from servesim.simulator.specs import gpus

    path = tmp_path / "gpus.yaml"
    path.write_text("x:\n  vendor_name: X\n  default_host: h100-hgx\n  p2p: false\n")
    monkeypatch.setattr(gpus, "_SPEC_FILE", path)
    with pytest.raises(InputError, match="describe a host, not the GPU") as e:
        gpus._registry.__wrapped__()
    assert e.value.field == "p2p" and e.value.allowed == "default_host"


def test_custom_allreduce_follows_vllm():
    assert custom_allreduce_rule(resolve_host(SERVER), 2) == (8 * MIB, f"on below {8 * MIB} B")
    assert custom_allreduce_rule(resolve_host(WS), 2) == (0, f"off: no GPU P2P on host {WS}")
    assert custom_allreduce_rule(resolve_host(SERVER), 2, disabled=True) == (0, "off: disable_custom_all_reduce")
    assert custom_allreduce_rule(resolve_host(SERVER), 4) == (0, "off: more than two PCIe-only GPUs")
    assert custom_allreduce_max_bytes(resolve_host(ACS_OFF), 2) == 8 * MIB  # P2P with ACS/IOMMU off
    assert custom_allreduce_max_bytes(resolve_gpu("h100"), 3) == 0  # world sizes 2/4/6/8 only
    assert custom_allreduce_max_bytes(resolve_gpu("h100"), 8) == MIB // 4  # NVSwitch, sm90 symm limit
    assert custom_allreduce_max_bytes(resolve_gpu("b200"), 4) == 2 * MIB
    assert custom_allreduce_max_bytes(resolve_gpu("rtx4090"), 2) == 0  # GeForce: no P2P


def test_without_p2p_nccl_ring_at_the_measured_bus_bandwidth():
    """LLMServingSim's bench host: 16.37 GB/s, 16.1 us per collective, NCCL for every size."""
    c = Collectives("rtx-pro-6000", 2, host=WS)
    assert c.source.custom_allreduce_max_bytes == 0 and c.source.host == WS
    assert c.source.allreduce.startswith("model: ring, 16.37 GB/s bus bandwidth, 16.1 us")
    for nbytes in (4096, 64 * 1024, 8 * MIB - 1, 8 * MIB, 64 * MIB):  # 2 GPUs: 2(n-1)/n = 1
        assert c.allreduce_s(nbytes) == pytest.approx(16.1e-6 + nbytes / 16.37e9, rel=1e-12)
    assert c.allgather_s(MIB) == pytest.approx(16.1e-6 + 0.5 * MIB / 16.37e9, rel=1e-12)
    four = Collectives("rtx-pro-6000", 4, host=WS)
    assert four.allreduce_s(MIB) == pytest.approx(16.1e-6 + 1.5 * MIB / 16.37e9, rel=1e-12)


def test_acs_off_host_uses_its_measured_nccl_tables():
    c = Collectives("rtx-pro-6000", 2, host=ACS_OFF)
    assert c.allreduce_s(4096) == pytest.approx(12.71e-6, rel=1e-12)
    assert c.allreduce_s(MIB) == pytest.approx(41.04e-6, rel=1e-12)
    assert c.allreduce_s(3 * MIB) == pytest.approx((67.31e-6 + 124.87e-6) / 2, rel=1e-12)
    assert c.allreduce_s(16 * MIB) == pytest.approx(471.12e-6, rel=1e-12)  # NCCL above the custom buffer
    assert "no measurement of it" in c.source.allreduce  # vLLM would run custom AR; none measured here
    assert c.allgather_s(2 * MIB) == pytest.approx(45.78e-6, rel=1e-12)  # 1 MiB per rank gathered
    assert c.reducescatter_s(512 * 1024) == pytest.approx(21.07e-6, rel=1e-12)  # 256 KiB per rank out
    assert c.alltoall_s(MIB) == pytest.approx(12.67e-6 + 0.5 * MIB / 35.72e9, rel=1e-12)  # ring model
    off = Collectives("rtx-pro-6000", 2, host=ACS_OFF, disable_custom_all_reduce=True)
    assert off.allreduce_s(MIB) == c.allreduce_s(MIB) and off.source.custom_allreduce.startswith("off")


def test_disabling_custom_allreduce_gives_nccl_for_every_size():
    on = Collectives("rtx-pro-6000", 2)
    off = Collectives("rtx-pro-6000", 2, disable_custom_all_reduce=True)
    nccl = Curve(*zip(*measured_tables(resolve_host(SERVER), 2)["nccl_allreduce"]))
    assert off.allreduce_s(4096) == nccl(4096) > on.allreduce_s(4096)
    assert off.allreduce_s(64 * MIB) == on.allreduce_s(64 * MIB) == nccl(64 * MIB)
    assert off.source.allreduce.startswith(f"measured on host {SERVER}: NCCL only")
    four = Collectives("rtx-pro-6000", 4)  # > 2 PCIe GPUs: vLLM turns it off itself
    nccl4 = Curve(*zip(*measured_tables(resolve_host(SERVER), 4)["nccl_allreduce"]))
    assert four.allreduce_s(4096) == nccl4(4096)


def test_every_cost_model_takes_the_host():
    roof = make_cost_model("roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=2, host=WS)
    assert roof.collectives.source.host == WS
    base = make_cost_model("roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=2)
    assert roof.step_time_s(prefill_shape(64)) > base.step_time_s(prefill_shape(64))
    cal = make_cost_model("calibrated", model="qwen3-32b", gpu="rtx-pro-6000", tp=2, host=WS)
    assert cal.allreduce_source.startswith("model: ring, 16.37 GB/s")
    assert cal._ar(1e6) == Collectives("rtx-pro-6000", 2, host=WS).allreduce_s(1e6)
    shipped = make_cost_model("calibrated", model="qwen3-32b", gpu="rtx-pro-6000", tp=2)
    assert shipped.allreduce_source.startswith("fitted file (roofline: measured")  # the file's own curve
    assert shipped.step_time_s(prefill_shape(64)) < cal.step_time_s(prefill_shape(64))
    with pytest.raises(InputError, match="has rtx-pro-6000 GPUs, not h100"):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=2, host=WS)


def test_hardware_host_in_the_config():
    cfg = apply_overrides(SimConfig(), {"hardware.model": "qwen3-32b", "hardware.gpu": "rtx-pro-6000",
                                        "hardware.tp": "2", "hardware.host": WS,
                                        "hardware.disable_custom_all_reduce": "true"})
    cm = run_cost_model(cfg)
    assert cm.collectives.source.host == WS and cm.collectives.source.custom_allreduce.startswith("off")
    with pytest.raises(InputError, match="did you mean 'rtx-pro-6000-workstation'") as e:
        apply_overrides(cfg, {"hardware.host": "rtx-pro-6000-workstaton"})
    assert e.value.field == "hardware.host"
    with pytest.raises(InputError, match="not h100") as e:
        apply_overrides(cfg, {"hardware.gpu": "h100", "hardware.model": "llama-3.1-8b"})
    assert e.value.field == "hardware.host"
    with pytest.raises(InputError) as e:
        apply_overrides(cfg, {"hardware.disable_custom_all_reduce": "maybe"})
    assert e.value.field == "hardware.disable_custom_all_reduce"
