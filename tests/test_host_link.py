"""`servesim calibrate --host-link`: host<->device copies as profile rows, and the line the CPU KV
tiers take from them (on the CPU: a functional rehearsal only)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from servesim.gpu_runner.host_link import HostLinkGrid, fit_link, measure_host_link


def test_fit_link_recovers_latency_and_bandwidth_exactly():
    rows = [{"op": "h2d_copy", "bytes": b, "latency_s": 10e-6 + b / 25e9} for b in (2**16, 2**22, 2**26)]
    rows += [{"op": "d2h_copy", "bytes": b, "latency_s": b / 20e9} for b in (2**16, 2**26)]
    lat, bw = fit_link(rows, "h2d_copy")
    assert lat == pytest.approx(10e-6) and bw == pytest.approx(25e9)
    assert fit_link(rows, "d2h_copy") == pytest.approx((0.0, 20e9))
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_link(rows[:1], "h2d_copy")
    with pytest.raises(ValueError, match="does not grow"):
        fit_link([{"op": "h2d_copy", "bytes": 1, "latency_s": 2.0}, {"op": "h2d_copy", "bytes": 2, "latency_s": 1.0}],
                 "h2d_copy")


def test_cpu_rehearsal_rows_follow_the_profile_schema(tmp_path):
    from servesim.simulator.cost_model.profile_schema import make_profile, read_profile, write_profile

    grid = HostLinkGrid(sizes_bytes=(4096, 65536), calls=2, samples=1)
    rows = measure_host_link("cpu", grid, "h100")
    assert [(r["op"], r["bytes"]) for r in rows] == [("h2d_copy", 4096), ("d2h_copy", 4096),
                                                     ("h2d_copy", 65536), ("d2h_copy", 65536)]
    assert all(r["latency_s"] > 0 and r["device"] == "cpu" for r in rows)
    write_profile(make_profile(rows), tmp_path / "p.csv")
    assert set(read_profile(tmp_path / "p.csv")["op"]) == {"h2d_copy", "d2h_copy"}


def test_calibrate_host_link_command_prints_the_settings(tmp_path):
    from servesim.cli import _register, app

    _register()
    out = tmp_path / "link.csv"
    result = CliRunner().invoke(app, ["calibrate", "--host-link", "--device", "cpu", "--gpu-label", "h100",
                                      "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "kv_offload.host_link_bytes_per_s=" in result.output and out.is_file()
