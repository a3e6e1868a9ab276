"""The GPU runner refuses weights (and KV) that do not fit the device's free memory before
allocating anything (gpu_runner/memory.py), with the sizes and what to change."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from servesim.gpu_runner import memory  # noqa: E402
from servesim.gpu_runner import model as runner_model  # noqa: E402
from servesim.gpu_runner.memory import USABLE_FRACTION, check_fits, cpu_available_bytes, weight_bytes  # noqa: E402
from servesim.gpu_runner.model import LlamaModel  # noqa: E402
from servesim.gpu_runner.weights import PRESETS  # noqa: E402
from servesim.traces.errors import InputError  # noqa: E402

TINY, BIG = PRESETS["tiny-llama"], PRESETS["llama-3.1-8b"]


def test_weight_bytes_are_the_parameters_at_the_dtype():
    assert weight_bytes(BIG, torch.float32) == BIG.num_params() * 4 == 4 * 8_030_261_248
    assert weight_bytes(BIG, torch.bfloat16) == BIG.num_params() * 2
    weights = runner_model.random_weights(TINY, dtype=torch.float32)
    tensors = [weights.embed, weights.final_norm, weights.lm_head] + [
        t for lw in weights.layers for t in (lw.attn_norm, lw.qkv_proj, lw.o_proj, lw.mlp_norm, lw.gate_up_proj,
                                             lw.down_proj)]
    assert sum(t.numel() * t.element_size() for t in tensors) == weight_bytes(TINY, torch.float32)


def test_cpu_available_reads_meminfo_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    assert cpu_available_bytes(meminfo, cg) == (20_000_000 * 1024, "MemAvailable in /proc/meminfo")
    (cg / "memory.max").write_text(f"{8 * 2**30}\n")
    (cg / "memory.current").write_text(f"{2 * 2**30}\n")
    assert cpu_available_bytes(meminfo, cg) == (6 * 2**30, "the cgroup's memory.max less memory.current")
    got, source = cpu_available_bytes(tmp_path / "absent", tmp_path / "absent")
    assert got > 0 and source == "available pages (sysconf)"


def _free(monkeypatch, num_bytes: int) -> None:
    monkeypatch.setattr(memory, "free_bytes", lambda device: (num_bytes, "a test's figure"))


def test_an_8b_model_in_fp32_on_a_small_host_is_refused_before_allocating(monkeypatch):
    _free(monkeypatch, 16 * 2**30)

    def never(*a, **k):
        raise AssertionError("allocated weights that could not fit")

    monkeypatch.setattr(runner_model, "random_weights", never)
    with pytest.raises(InputError) as e:
        LlamaModel.random(BIG, dtype=torch.float32, device="cpu")
    msg = str(e.value)
    assert "29.9 GiB of llama-3.1-8b weights (float32) do not fit on cpu: 16.0 GiB free (a test's figure)" in msg
    assert e.value.field == "hardware.model" and "tiny-llama" in msg


def test_the_margin_and_kv_count(monkeypatch):
    need = weight_bytes(TINY, torch.float32)
    _free(monkeypatch, int(need / USABLE_FRACTION) + 1)
    check_fits(TINY, torch.float32, "cpu")  # fits with the margin
    with pytest.raises(InputError, match=r"and 0\.0 MiB of KV cache"):
        check_fits(TINY, torch.float32, "cpu", kv_bytes=1024)


def test_a_model_that_fits_is_built(monkeypatch):
    _free(monkeypatch, 2**30)
    m = LlamaModel.random(TINY, dtype=torch.float32, device="cpu")
    assert m.weights.embed.shape == (512, 64)


def test_the_gpu_executor_checks_weights_and_kv_together(monkeypatch):
    from servesim.gpu import make_gpu_executor
    from servesim.overrides import apply_overrides
    from servesim.simulator.config import SimConfig

    cfg = apply_overrides(SimConfig(), {"hardware.model": "tiny-llama", "cache.num_gpu_blocks": 4096,
                                        "scheduler.max_model_len": 1024})
    _free(monkeypatch, 8 * 2**20)  # 8 MiB: the weights (0.5 MiB) fit, the 32 MiB of KV do not
    with pytest.raises(InputError, match=r"0\.5 MiB of tiny-llama weights \(float32\) and 32\.0 MiB of KV cache do "
                                         r"not fit on cpu: 8\.0 MiB free"):
        make_gpu_executor(cfg, device="cpu")
