"""Traces from streams (/dev/stdin, FIFOs, process substitutions: read once, bounded) and OS errors
that name their path (a folder, permission denied, a full disk), never a traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from servesim.api import run
from servesim.running import load_trace
from servesim.simulator.config import SimConfig
from servesim.simulator.yaml_input import MAX_YAML_BYTES, read_text_bounded
from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload
from servesim.traces.streams import is_stream, os_error, spooled
from servesim.traces.workload import RequestSpec, Workload

ROWS = ('{"request_id": "a", "arrival_time_s": 0.0, "prompt_len": 100, "output_len": 5}\n'
        '{"request_id": "b", "arrival_time_s": 0.1, "prompt_len": 50, "output_len": 3}\n')


def _fifo(tmp_path: Path, data: bytes, name: str = "trace.jsonl") -> Path:
    """A named pipe a writer thread fills with `data` once a reader opens it."""
    fifo = tmp_path / name
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)

    threading.Thread(target=write, daemon=True).start()
    return fifo


def test_a_fifo_is_a_trace_read_once(tmp_path):
    fifo = _fifo(tmp_path, ROWS.encode())
    assert is_stream(fifo) and not is_stream(tmp_path) and not is_stream(tmp_path / "missing")
    wl = load_trace(fifo)
    assert [(r.request_id, r.prompt_len, r.output_len) for r in wl.requests] == [("a", 100, 5), ("b", 50, 3)]
    assert wl.source == f"{fifo} (a stream, read once)" and wl.name == "trace"
    assert wl.spec is None  # nothing can rebuild it: a result never names the spent stream


def test_a_bad_row_in_a_stream_names_the_stream_not_its_copy(tmp_path):
    fifo = _fifo(tmp_path, b'{"request_id": "a", "arrival_time_s": "x", "prompt_len": 1, "output_len": 1}\n')
    with pytest.raises(InputError) as e:
        load_workload(fifo)
    assert e.value.path == str(fifo) and e.value.line == 1 and e.value.field == "arrival_time_s"


def test_an_endless_stream_is_refused_at_the_bound(tmp_path):
    fifo = _fifo(tmp_path, b"x" * 5000, name="endless")
    with pytest.raises(InputError) as e:
        with spooled(fifo, max_bytes=4096):
            pass
    assert e.value.path == str(fifo) and "longer than" in str(e.value)


def test_a_folder_or_missing_file_is_named_as_such(tmp_path):
    with pytest.raises(InputError, match="this is a folder, not a trace file") as e:
        load_workload(tmp_path)
    assert e.value.path == str(tmp_path)
    with pytest.raises(InputError, match="file not found"):
        load_workload(tmp_path / "nope.jsonl")


def test_permission_denied_names_the_trace(tmp_path, monkeypatch):
    trace = tmp_path / "t.jsonl"
    trace.write_text(ROWS)
    import servesim.traces.rows as rows

    def denied(path, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(rows, "open", denied, raising=False)
    with pytest.raises(InputError) as e:
        load_workload(trace)
    assert e.value.path == str(trace) and "Permission denied" in str(e.value)
    assert "check its permissions" in str(e.value)


def test_os_error_wording():
    err = os_error(IsADirectoryError(errno.EISDIR, "Is a directory"), "/x", "read the trace")
    assert str(err) == "/x: cannot read the trace: Is a directory (allowed: a file, not a folder)"


def test_a_full_disk_while_writing_results_names_the_folder(tmp_path, monkeypatch):
    import servesim.simulator.outputs as outputs

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no path

    monkeypatch.setattr(outputs, "write_csv", full)
    out = tmp_path / "res"
    with pytest.raises(OSError) as e:
        run(SimConfig(), Workload([RequestSpec("a", 0.0, 10, 2)], "t", "t"), out_dir=out)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no staging folder left behind


@pytest.mark.parametrize("failing", ["steps", "requests"])
def test_a_full_disk_while_writing_a_table_names_the_folder(tmp_path, monkeypatch, failing):
    """The steps table is written on a second thread beside the requests table (outputs._write_tables):
    a full disk in either names the result folder, and nothing is left (the other file is finished
    or abandoned before the staging folder is removed)."""
    import servesim.simulator.outputs as outputs

    real_parquet = outputs.write_parquet  # (write_requests_parquet writes through it)
    written: list[str] = []

    def maybe_full(table, path, *a, **k):
        if path.name == f"{failing}.parquet":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_parquet(table, path, *a, **k)
        written.append(path.name)

    monkeypatch.setattr(outputs, "write_parquet", maybe_full)
    out = tmp_path / "res"
    with pytest.raises(OSError) as e:
        run(SimConfig(), Workload([RequestSpec("a", 0.0, 10, 2)], "t", "t"), out_dir=out)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out)
    assert written == [{"steps": "requests", "requests": "steps"}[failing] + ".parquet"]  # the other one finished
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_one_file_names_it(tmp_path):
    from servesim.simulator.outfile import atomic_path

    target = tmp_path / "trace.jsonl"
    with pytest.raises(OSError) as e:
        with atomic_path(target):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.filename == str(target) and os.listdir(tmp_path) == []


def test_yaml_inputs_are_read_once_and_bounded(tmp_path):
    fifo = _fifo(tmp_path, b"name: x\n", name="scenario.yaml")
    assert read_text_bounded(fifo, "scenario") == "name: x\n"
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_YAML_BYTES + 1))
    with pytest.raises(InputError, match="longer than 8 MiB") as e:
        read_text_bounded(big, "scenario")
    assert e.value.path == str(big)
    with pytest.raises(InputError, match="cannot read scenario: Is a directory"):
        read_text_bounded(tmp_path, "scenario")


def test_cli_replays_dev_stdin(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "servesim", "replay", "/dev/stdin", "--out", str(tmp_path / "r")],
                          input=ROWS, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "finished 2/2" in proc.stdout + proc.stderr and (tmp_path / "r" / "summary.json").is_file()
