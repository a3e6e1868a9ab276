"""Ray like local: the private local cluster's processes never outlive the driver (the reaper), its
temporary folder is private and removed, and SIGTERM / Ctrl-C keep servesim's handlers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servesim.scenario import ray_reaper
from servesim.scenario.ray_session import MARKER_NAME, our_signal_handlers, private_cluster

LINUX = sys.platform.startswith("linux")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not LINUX, reason="the reaper finds processes through /proc")
def test_the_reaper_kills_marked_processes_and_removes_the_folder_when_the_driver_ends(tmp_path):
    with private_cluster() as temp_dir:
        folder = temp_dir.parent
        assert oct(folder.stat().st_mode & 0o777) == "0o700" and folder.name.startswith("servesim-ray-")
        token = os.environ[MARKER_NAME]
        marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # inherits the marker
        (temp_dir).mkdir()
        log = open(temp_dir / "agent.log", "w")  # noqa: SIM115 - held open by the "agent" below
        agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=log,
                                 env={k: v for k, v in os.environ.items() if k != MARKER_NAME})
        log.close()
        unmarked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                    env={k: v for k, v in os.environ.items() if k != MARKER_NAME})
        held = open(temp_dir / "driver.log", "w")  # noqa: SIM115 - the driver holds a file there too
        got = ray_reaper.marked_pids(f"{MARKER_NAME}={token}".encode(), str(folder), spared=os.getpid())
        assert sorted(got) == sorted([marked.pid, agent.pid])  # by its environment; by its open log file
        assert ray_reaper.marked_pids(f"{MARKER_NAME}={token}".encode(), str(folder), spared=agent.pid) == [marked.pid]
        (temp_dir / "session_x").mkdir()
    held.close()  # this process (the driver) was spared while it held it
    assert MARKER_NAME not in os.environ
    assert marked.wait(timeout=10) == -signal.SIGKILL and agent.wait(timeout=10) == -signal.SIGKILL
    assert unmarked.poll() is None  # not ours: left alone
    unmarked.kill()
    unmarked.wait()
    assert not folder.exists()


@pytest.mark.skipif(not LINUX, reason="the reaper finds processes through /proc")
def test_the_reaper_outlives_a_sigkilled_driver(tmp_path):
    """A driver process (here a child python) SIGKILLed mid-run: its marked children are killed."""
    pid_file = tmp_path / "pids"
    driver = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from servesim.scenario.ray_session import private_cluster
with private_cluster() as d:
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    open({str(pid_file)!r}, 'w').write(f'{{child.pid}} {{d.parent}}')
    time.sleep(60)
"""])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    child_pid, folder = pid_file.read_text().split()
    driver.kill()
    driver.wait()
    for _ in range(100):
        if not _alive(int(child_pid)) and not Path(folder).exists():
            break
        time.sleep(0.1)
    assert not _alive(int(child_pid)) and not Path(folder).exists()


def test_signal_handlers_come_back_after_a_library_replaces_them():
    def ours(signum, frame):
        pass

    # Both handlers set here: what the process had before depends on its runner (an xdist worker
    # ignores SIGINT, so the controller alone hears Ctrl-C).
    before = signal.signal(signal.SIGTERM, ours)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with our_signal_handlers():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does (its own handler)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_int)


def _ray_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "raylet|gcs_server|ray::|log_monitor|dashboard.py|default_worker"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and "<defunct>" not in line]


@pytest.mark.xdist_group("ray")  # one worker runs every test that starts Ray (Makefile: --dist loadgroup)
@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="the reaper finds processes through /proc")
@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)])
def test_a_ray_sweep_driver_killed_mid_run_leaves_no_ray_process(tmp_path, sig, status):
    """The edges2/ray_sweep_kill.sh reproducer: SIGTERM gives servesim's note and 143; after SIGKILL
    no Ray process outlives the driver for more than a few seconds; no folder is left in /tmp."""
    pytest.importorskip("ray")
    if _ray_processes():
        pytest.skip("Ray processes already running on this machine")
    (tmp_path / "sweep.yaml").write_text(
        # Variants of a few seconds each (the compiled build runs the bundled trace in 0.3 s): the
        # signal must land while the sweep runs.
        "name: raykill\nworkload: {generator: poisson, num_requests: 60000, arrival: {rate_per_s: 40},\n"
        "  prompt_len: 512, output_len: 256}\nhardware: {model: llama-3.1-8b, gpu: h100}\n"
        "scheduler: {max_model_len: 8192}\nsweep:\n  scheduler.max_num_seqs: [16, 32, 64, 128]\n"
        "  workload.arrival.rate_per_s: [20, 40]\n")
    before = set(Path(tempfile_dir()).glob("servesim-ray-*"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    driver = subprocess.Popen([sys.executable, "-m", "servesim", "run", "sweep.yaml", "--backend", "ray", "--workers",
                               "2", "--out", "out"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for _ in range(1800):
        if any("ray::execute" in p for p in _ray_processes()):
            break
        time.sleep(0.1)
    time.sleep(2)
    driver.send_signal(sig)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == status, out
    if sig == signal.SIGTERM:
        assert "terminated: finished variants are kept in out/variants/" in out and "Traceback" not in out
    for _ in range(100):
        if not _ray_processes() and set(Path(tempfile_dir()).glob("servesim-ray-*")) <= before:
            break
        time.sleep(0.1)
    assert _ray_processes() == []
    assert set(Path(tempfile_dir()).glob("servesim-ray-*")) <= before


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()
