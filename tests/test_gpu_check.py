"""tools/gpu_check.py (`make gpu-check`): the CPU rehearsal end to end, and its pieces on
hand-built inputs (step kinds, the error table, the trace comparison, the time box, the carried
zips, the output-folder rule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from gpucheck.carry import zip_package  # noqa: E402
from gpucheck.lockstep import compare_step_traces, error_table, step_kind  # noqa: E402
from gpucheck.part import OverBudget, Part  # noqa: E402
from servesim.scheduler.step_shape import StepShape  # noqa: E402


def _part(budget_s: float = 60.0) -> Part:
    return Part("t", budget_s, lambda msg: None)


def test_step_kind_from_the_shape_counters():
    assert step_kind(StepShape((1, 1), (5, 9), 2)) == "decode"
    assert step_kind(StepShape((30,), (0,), 1)) == "prefill"
    assert step_kind(StepShape((16,), (32,), 0)) == "prefill"  # a chunk over a cached prefix
    assert step_kind(StepShape((1,), (0,), 1)) == "prefill"  # a one-token prompt has no cache yet
    assert step_kind(StepShape((1, 7), (40, 0), 2)) == "mixed"


def test_error_table_medians_and_p90_by_kind():
    rows = [{"kind": "decode", "measured_s": 1.0, "predicted_m_s": p} for p in (1.1, 0.8, 1.0, 1.5)]
    rows.append({"kind": "prefill", "measured_s": 2.0, "predicted_m_s": 3.0})
    table = error_table(rows, ["m"])
    # decode: |errors| 0.1, 0.2, 0, 0.5 -> median 15 %, p90 (index 3 of 4) 50 %, signed median +5 %
    assert table[2] == "| prefill | m | 1 | 50.0 % | 50.0 % | +50.0 % |"
    assert table[3] == "| decode | m | 4 | 15.0 % | 50.0 % | +5.0 % |"
    assert len(table) == 4  # no mixed steps: no row


def test_trace_comparison_fails_the_part_on_one_field(tmp_path):
    recs = [{"step": 0, "num_scheduled_tokens": {"a": 5, "b": 1}}, {"step": 1, "num_scheduled_tokens": {"a": 1}}]
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in recs))
    b.write_text(a.read_text())
    recs[0]["num_scheduled_tokens"] = {"b": 1, "a": 5}  # same counts, other order: a difference
    c.write_text("".join(json.dumps(r) + "\n" for r in recs))
    same, differ = _part(), _part()
    compare_step_traces(same, a, b, "x")
    compare_step_traces(differ, a, c, "x")
    assert same.ok and "2 step records, identical" in same.lines[0]
    assert not differ.ok and "field 'num_scheduled_tokens'" in differ.failures[0]


def test_part_time_box_stops_a_replay():
    p = _part(budget_s=0.0)
    with pytest.raises(OverBudget):
        p.progress(1.0, 0)
    assert p.timed_out and not p.ok and p.failures == ["stopped at its budget of 0 s"]
    q = _part()
    q.progress(1.0, 0)  # within budget: nothing happens
    assert q.ok


def test_carried_package_zip_imports_without_the_installed_one(tmp_path):
    z = zip_package("simpy", tmp_path)
    code = ("import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]; "
            f"sys.path.append({str(z)!r}); import simpy; print(simpy.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(z))


@pytest.mark.slow
def test_an_existing_foreign_output_folder_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    p = subprocess.run([sys.executable, "tools/gpu_check.py", "--device", "cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "SERVESIM_PURE_PYTHON": "1"})
    assert p.returncode == 2 and "not a servesim result" in p.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep"


# Runs tools/gpu_check.py as the GPU machine would: simpy and gguf importable from the carried zips
# only (the installed ones hidden), so the rehearsal proves the carry is enough.
ONLY_CARRIED = """
import os, runpy, sys, zipimport
class OnlyCarried:
    def find_spec(self, name, path=None, target=None):
        if path is not None or name.split('.')[0] not in ('simpy', 'gguf'):
            return None
        for entry in sys.path:
            if entry.endswith('.zip') and os.path.isfile(entry):
                spec = zipimport.zipimporter(entry).find_spec(name)
                if spec is not None:
                    return spec
        raise ModuleNotFoundError(name + ' (not carried)', name=name)
sys.meta_path.insert(0, OnlyCarried())
sys.argv = ['tools/gpu_check.py', *sys.argv[1:]]
runpy.run_path('tools/gpu_check.py', run_name='__main__')
"""


@pytest.mark.slow
def test_cpu_rehearsal_passes_every_part(tmp_path):
    """`make gpu-check DEVICE=cpu`: the carry made here, then every part on the CPU (~60-90 s on 2
    cores: the interpreter's kernel cases and three tiny replays)."""
    from gpucheck.carry import make_carry

    carry = tmp_path / "carry"
    files = make_carry(carry)
    assert sorted(f.name for f in files) == ["gguf.zip", "simpy.zip", "smollm2-cut.npz"]
    assert sum(f.stat().st_size for f in files) < 20 * 2**20  # beside a ~37 MB tree, under 64 MiB
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", ONLY_CARRIED, "--device", "cpu", "--out", str(out), "--carry",
                        str(carry)], capture_output=True, text=True, cwd=ROOT, timeout=1500,
                       env={**os.environ, "SERVESIM_PURE_PYTHON": "1"})
    report = (out / "report.md").read_text()
    assert p.returncode == 0, report + p.stdout[-3000:] + p.stderr[-3000:]
    assert report.startswith("# gpu-check (cpu): PASSED") and "**FAILED**" not in report
    assert report.count("identical field for field") == 2  # 8B-shaped (tiny here) and SmolLM2 replays
    assert (out / ".servesim").read_text().strip() == "gpu-check"
    assert (out / "trace_sim.jsonl").read_bytes() == (out / "trace_gpu.jsonl").read_bytes()
    steps = (out / "steps_measured.csv").read_text().splitlines()
    assert steps[0].startswith("kind,num_tokens,num_requests,prepare_s,measured_s,predicted_roofline_s")
    assert {line.split(",")[0] for line in steps[1:]} == {"prefill", "decode", "mixed"}
    assert (out / "tiny-llama__h100__fitted.json").is_file() and "Against the shipped profile" in report
    assert "Where an eager step's time goes" in report and "| decode 2 x 32 | 2 | 2 |" in report


def test_graph_probe_on_the_cpu_times_each_step_and_prices_it(tmp_path):
    """tools/gpu_graph_probe.py's CPU path: tiny-llama's two steps timed (no graphs on the CPU),
    priced by the roofline; --csv writes a new file and refuses an existing one."""
    import gpu_graph_probe

    out = tmp_path / "probe.csv"
    assert gpu_graph_probe.main(["--device", "cpu", "--repeats", "1", "--gpu", "h100", "--csv", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(gpu_graph_probe.FIELDS) and len(lines) == 3
    rows = [dict(zip(gpu_graph_probe.FIELDS, line.split(","))) for line in lines[1:]]
    assert [r["step"] for r in rows] == ["decode 2 x 32", "prefill 16"]
    assert [r["num_tokens"] for r in rows] == ["2", "16"] and [r["num_requests"] for r in rows] == ["2", "1"]
    assert all(float(r["eager_ms"]) > 0 and float(r["roofline_ms"]) > 0 and r["graph_ms"] == "" for r in rows)
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(SystemExit):
        gpu_graph_probe.main(["--device", "cpu", "--csv", str(out)])
    assert out.read_text().splitlines() == lines  # the existing file kept as it was


class _BrokenKernels:
    """A 'triton' backend that is the torch reference with one planted fault."""

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def reshape_and_cache(self, *args) -> None:
        from servesim.gpu_runner.ops import reference

        reference.reshape_and_cache(*args)

    def unified_attention(self, q, kc, vc, out, qsl, seq_lens, table, scale) -> None:
        from servesim.gpu_runner.ops import reference

        reference.unified_attention(q, kc, vc, out, qsl, seq_lens, table, scale)
        n = int(qsl[-1])
        if self.fault == "off":
            out[:n] += 0.01  # over every dtype's tolerance
        elif self.fault == "padding":
            out[n:] = 0.0  # rows of padding tokens written


@pytest.mark.parametrize("fault,why", [("off", "over tolerance"), ("padding", "padding token's row was written")])
def test_a_wrong_kernel_fails_the_kernel_part(monkeypatch, fault, why):
    import torch

    from gpucheck import kernels
    from servesim.gpu_runner import ops

    real = ops.backend_module
    monkeypatch.setattr(ops, "backend_module", lambda b: _BrokenKernels(fault) if b == "triton" else real(b))
    ok, _, msg = kernels.attention_case(torch.float32, 3, 2, 96, 16, "mixed", torch.device("cpu"))
    assert not ok and why in msg
    monkeypatch.setattr(ops, "backend_module", lambda b: _BrokenKernels("none") if b == "triton" else real(b))
    ok, err, msg = kernels.attention_case(torch.float32, 3, 2, 96, 16, "mixed", torch.device("cpu"))
    assert ok and err == 0.0 and msg == ""


def test_report_names_each_failure_and_the_verdict():
    from gpucheck.run import report

    good, bad = _part(), _part()
    good.title, bad.title = "2. Kernels", "3. Lock step"
    bad.check(False, "llama random weights: step traces differ (record 4 ...)")
    text = report([good, bad], "cuda", "h200", "from the device name 'NVIDIA H200'", 300.0)
    assert text.startswith("# gpu-check (cuda): FAILED")
    assert "| 3. Lock step | **FAILED** |" in text and "| 2. Kernels | passed |" in text
    assert "- llama random weights: step traces differ (record 4 ...)" in text
