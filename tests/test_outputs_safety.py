"""Outputs are safe and processes clean up: foreign folders refused, --overwrite, the --out lock,
stale staging removed, the umask respected, concurrent publishers (reproducer r7), workers that die
with a SIGKILLed driver, Ctrl-C that says what was kept, the local Ray cluster on loopback."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servesim.scenario import store
from servesim.simulator.outdir import MARKER, check_output, claim_output, clean_stale, locked, result_kind
from servesim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_foreign_folder_file_and_cwd_are_refused(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(InputError, match="not a servesim result"):
        check_output(mine)
    with pytest.raises(InputError, match="is a file"):
        check_output(mine / "notes.txt")
    monkeypatch.chdir(mine)
    with pytest.raises(InputError, match="current folder"):
        check_output(".")
    assert (mine / "notes.txt").read_text() == "precious"
    assert check_output(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"  # parents are created


def test_earlier_result_needs_overwrite_and_sweep_resumes_only_a_sweep(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / MARKER).write_text("replay\n")
    (res / "summary.json").write_text("{}")
    with pytest.raises(InputError, match="--overwrite"):
        check_output(res)
    assert check_output(res, overwrite=True) == res
    with pytest.raises(InputError, match="replay result, not a sweep"):
        check_output(res, resume="sweep")



def test_only_the_marker_makes_a_folder_ours(tmp_path):
    """A user's folder that happens to hold files with our names (a thesis with its summary.json,
    config.yaml and .tex) is not a result: --overwrite must not delete it."""
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    for name, text in (("summary.json", "{}"), ("config.yaml", "a: 1\n"), ("sweep.json", "{}"),
                       ("chapter1.tex", "precious")):
        (thesis / name).write_text(text)
    assert result_kind(thesis) is None
    for kwargs in ({"overwrite": True}, {"resume": "sweep"}):
        with pytest.raises(InputError, match="not a servesim result"):
            check_output(thesis, **kwargs)
    linked = tmp_path / "linked"  # a marker that is a link to a file elsewhere is not ours either
    linked.mkdir()
    (tmp_path / "elsewhere").write_text("replay\n")
    (linked / MARKER).symlink_to(tmp_path / "elsewhere")
    assert result_kind(linked) is None
    assert (thesis / "chapter1.tex").read_text() == "precious"


def test_lock_never_follows_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    out = tmp_path / "out"
    (tmp_path / ".out.lock").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        with locked(out):
            pass
    assert victim.read_text() == "someone else's file"


def test_unwritable_parent_is_found_before_simulating(tmp_path):
    with pytest.raises(InputError, match="cannot write results"):
        check_output("/proc/servesim-test/out")


def test_lock_refuses_a_second_holder_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with locked(out):
        with pytest.raises(InputError, match=rf"another servesim run \(pid {os.getpid()}\) is writing"):
            with locked(out):
                pass
    assert list(tmp_path.iterdir()) == []  # the lock file is removed on release


def test_lock_holds_across_processes(tmp_path):
    out = tmp_path / "out"
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from servesim.simulator.outdir import locked\n"
            "with locked(%r):\n    print('held', flush=True); time.sleep(30)\n") % (str(ROOT), str(out))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            with claim_output(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    with claim_output(out):  # the dead holder's lock is free again (the kernel released it)
        pass


def test_stale_staging_is_cleaned_but_nothing_else(tmp_path):
    out = tmp_path / "run"
    (tmp_path / ".run.servesim-tmp.abc123").mkdir()
    (tmp_path / ".run.servesim-tmp.abc123" / "requests.parquet").write_bytes(b"half")
    (tmp_path / ".run.mine").mkdir()  # not our tag: kept
    clean_stale(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.mine"]


def test_result_folders_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        _tiny_replay(tmp_path / "r")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "r").stat().st_mode)
    assert mode == 0o755, oct(mode)
    assert stat.S_IMODE((tmp_path / "r" / "summary.json").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no staging or lock left beside it


def _tiny_replay(out: Path):
    from servesim.api import load_trace, run
    from servesim.simulator.config import SimConfig

    return run(SimConfig(), load_trace(None, max_requests=5), out_dir=out)


@pytest.mark.slow
def test_api_refuses_foreign_folder_and_replaces_only_with_overwrite(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not a servesim result"):
        _tiny_replay(foreign)
    assert (foreign / "keep.txt").read_text() == "x"
    _tiny_replay(tmp_path / "r")
    with pytest.raises(InputError, match="earlier servesim result"):
        _tiny_replay(tmp_path / "r")
    from servesim.api import load_trace, run
    from servesim.simulator.config import SimConfig

    run(SimConfig(), load_trace(None, max_requests=3), out_dir=tmp_path / "r", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "r"]


@pytest.mark.slow
@pytest.mark.parametrize("with_summary", [True, False])
def test_concurrent_publishers_never_fail(tmp_path, with_summary):
    """Reproducer r7: several processes publishing the same variant at once."""
    code = ("import sys, collections; sys.path.insert(0, %r)\n"
            "from servesim.scenario import store\n"
            "errs = collections.Counter()\n"
            "for i in range(300):\n"
            "    try:\n"
            "        store.publish(%r, 'v', {'a.bin': b'x' * 1000%s})\n"
            "    except Exception as e:\n"
            "        errs[type(e).__name__] += 1\n"
            "print(dict(errs))\n") % (str(ROOT), str(tmp_path), ", 'summary.json': b'{}'" if with_summary else "")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["{}"] * 4
    assert list((tmp_path / store.STAGING).iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "variants" / "v").iterdir()) == sorted(
        ["a.bin", *(["summary.json"] if with_summary else [])])


def test_a_complete_variant_is_never_replaced_by_a_failure(tmp_path):
    store.publish(tmp_path, "v", {"summary.json": b"{}"})
    store.publish(tmp_path, "v", {"error.txt": b"worker died"})
    assert sorted(p.name for p in (tmp_path / "variants" / "v").iterdir()) == ["summary.json"]


SLOW_SCENARIO = """name: slow
workload: {generator: poisson, num_requests: 4000, arrival: {rate_per_s: 50}, prompt_len: 500, output_len: 200}
sweep: {scheduler.max_num_seqs: [8, 16, 32, 64]}
"""


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[0::2]), map(int, out[1::2])))
    return {p for p, pp in pairs if pp == pid}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat_file = Path(f"/proc/{pid}/stat")
    return not (stat_file.exists() and stat_file.read_text().split()[2] == "Z")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and ps")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_workers_die_with_their_driver(tmp_path, sig):
    (tmp_path / "slow.yaml").write_text(SLOW_SCENARIO)
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "servesim", "run", str(tmp_path / "slow.yaml"), "--out", str(out),
                               "--workers", "2"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              # a shell's background jobs start with SIGINT ignored: give it Ctrl-C back
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        time.sleep(0.3)
        workers = {c for c in _children(driver.pid) if "spawn_main" in _cmdline(c)}
    assert len(workers) >= 2, "the pool did not start"
    time.sleep(1.0)
    driver.send_signal(sig)
    _, err = driver.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "orphaned workers"
    if sig == signal.SIGINT:
        assert driver.returncode == 130
        assert "interrupted: finished variants are kept" in err and "to resume, run again" in err
        assert "Traceback" not in err
    assert not (tmp_path / ".out.lock").exists() or sig == signal.SIGKILL


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_local_ray_environment_binds_to_loopback_with_a_token():
    from servesim.scenario.backends import local_ray_env

    env = local_ray_env()
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and env["RAY_AUTH_MODE"] == "token"
    assert len(env["RAY_AUTH_TOKEN"]) == 64 and env["RAY_AUTH_TOKEN"] != local_ray_env()["RAY_AUTH_TOKEN"]


@pytest.mark.xdist_group("ray")  # one worker runs every test that starts Ray (Makefile: --dist loadgroup)
@pytest.mark.slow
def test_local_ray_cluster_listens_only_on_loopback(tmp_path):
    pytest.importorskip("ray")
    if subprocess.run(["which", "ss"], capture_output=True).returncode != 0:
        pytest.skip("needs ss")
    code = ("import os, subprocess, sys; sys.path.insert(0, %r)\n"
            "from servesim.scenario.backends import local_ray_env\n"
            "os.environ.update(local_ray_env())\n"
            "import ray, logging\n"
            "ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)\n"
            "print(subprocess.run(['ss', '-ltnp'], capture_output=True, text=True).stdout)\n"
            "ray.shutdown()\n") % str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180).stdout
    ray_lines = [line for line in out.splitlines() if any(n in line for n in ("gcs_server", "raylet", "ray::"))]
    assert ray_lines, out
    assert all("127.0.0.1" in line for line in ray_lines), "\n".join(ray_lines)


MEDIUM_SCENARIO = """name: medium
workload: {generator: poisson, num_requests: 600, arrival: {rate_per_s: 40}, prompt_len: 400, output_len: 100}
sweep: {scheduler.max_num_seqs: [8, 16, 32, 64]}
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_sigkilled_sweep_resumes_and_a_second_run_is_refused(tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    (tmp_path / "m.yaml").write_text(MEDIUM_SCENARIO)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "servesim", "run", str(tmp_path / "m.yaml"), "--out", str(out), "--workers", "1"]
    driver = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("variants/*/summary.json")):
        time.sleep(0.2)
    done_first = {p.parent.name for p in out.glob("variants/*/summary.json")}
    assert done_first, "no variant finished in time"
    second = CliRunner().invoke(app, ["run", str(tmp_path / "m.yaml"), "--out", str(out), "--workers", "1"])
    assert second.exit_code == 2 and "another servesim run" in second.output  # it would compute the same
    driver.kill()
    driver.wait()
    resumed = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("cached") >= len(done_first)
    assert len(list(out.glob("variants/*/summary.json"))) == 4
    assert not (out / store.STAGING).exists()  # the killed run's debris was removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml", "out"]  # no lock or staging beside it


def test_progress_lines_without_a_terminal():
    import io

    from rich.console import Console

    from servesim.report import progress_reporter

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    with progress_reporter(console, 10, every_s=0.0) as progress:
        progress(1.5, 5)
        progress(3.0, 10)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("simulating: 5/10 requests, sim t=1.5 s") and "ETA" in lines[0]
    assert lines[1].startswith("simulating: 10/10 requests")


def test_cpu_device_fits_the_documented_budget():
    pytest.importorskip("torch")
    import dataclasses

    from servesim.gpu import CPU_KV_BUDGET_GIB, fit_cpu_kv_pool
    from servesim.simulator.config import SimConfig

    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model="tiny-llama")
    fitted, note = fit_cpu_kv_pool(cfg, "cpu")
    assert not fitted.derive_num_gpu_blocks and fitted.cache.num_gpu_blocks >= 1 and "CPU budget" in note
    from servesim.gpu_runner.weights import preset

    m = preset("tiny-llama")
    gib = 2 * m.num_layers * fitted.cache.block_size * m.num_kv_heads * m.head_dim * 4 \
        * fitted.cache.num_gpu_blocks / 2**30
    assert gib <= CPU_KV_BUDGET_GIB
    assert fit_cpu_kv_pool(cfg, "cuda") == (cfg, None)  # the GPU keeps the derived pool
    given = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, num_gpu_blocks=256),
                                derive_num_gpu_blocks=False)
    assert fit_cpu_kv_pool(given, "cpu") == (given, None)  # a pool the user set is kept


@pytest.mark.xdist_group("ray")  # one worker runs every test that starts Ray (Makefile: --dist loadgroup)
@pytest.mark.slow
def test_ray_sweep_output_has_no_third_party_warnings(tmp_path):
    pytest.importorskip("ray")
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\nworkload: {generator: poisson, num_requests: 6}\nsweep: {scheduler.max_num_seqs: [4, 8]}\n")
    res = subprocess.run([sys.executable, "-m", "servesim", "run", str(scen), "--out", str(tmp_path / "o"),
                          "--backend", "ray", "--workers", "2"], env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "authentication" not in (res.stdout + res.stderr).lower()
    assert "warning" not in res.stderr.lower(), res.stderr


def test_tables_keep_every_column_without_a_terminal(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    monkeypatch.delenv("COLUMNS", raising=False)
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\nworkload: {generator: poisson, num_requests: 4}\n"
                    "sweep: {scheduler.max_num_seqs: [4, 8], cache.enable_prefix_caching: [true, false]}\n")
    res = CliRunner().invoke(app, ["run", str(scen), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if "TTFT50 ms" in line)
    for column in ("variant", "TTFT99 ms", "TPOT50 ms", "tok/s", "preempt", "hit %"):
        assert column in header, header
    assert max(len(line) for line in res.output.splitlines()) > 80  # not cut to 80 columns


@pytest.mark.slow
def test_interrupted_replay_says_what_was_kept_and_leaves_nothing(tmp_path):
    # A workload that simulates for many seconds step by step, so the interrupt lands mid-simulation
    # (the bundled sample now replays in about a second).
    proc = subprocess.Popen([sys.executable, "-m", "servesim", "replay", "--dataset-name", "random",
                             "--num-prompts", "20000", "--request-rate", "50", "--no-macro-steps",
                             "--out", "runs/r"],
                            cwd=tmp_path, env={**ENV, "SERVESIM_PROGRESS_EVERY_S": "0.5"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "runs" / ".r.lock").exists():
        time.sleep(0.1)  # the lock exists once the run has checked --out and started simulating
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # (0: it finished before the interrupt; the workload is too small)
    assert "interrupted: nothing was written to runs/r/" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # no lock, no staging, not even the parent it created


def test_interrupt_after_publishing_says_the_results_are_complete(tmp_path, monkeypatch):
    """Ctrl-C while the summary prints, after the folder was published: the note names the folder
    as complete instead of claiming nothing was written."""
    from typer.testing import CliRunner

    import servesim.running as running
    from servesim.cli import _register, app

    _register()  # the commands, as main() registers them

    def interrupted(_requests):
        raise KeyboardInterrupt

    monkeypatch.setattr(running, "warn_rejected", interrupted)  # runs after write_results
    out = tmp_path / "r"
    res = CliRunner().invoke(app, ["replay", "--max-requests", "20", "--out", str(out)])
    assert res.exit_code == 130, res.output
    assert f"interrupted: {out}/ is complete (it was written before the interrupt)" in res.output
    assert result_kind(out) == "replay" and (out / "summary.json").is_file()
