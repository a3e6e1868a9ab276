"""The frontend model, the frontend probe against a loopback stub, and bench-serve metric rules."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.simulator.bench_metrics import GoodputSlo, bench_serve_result, inference_perf_stages
from servesim.simulator.frontend import FrontendConfig
from servesim.frontend_probe import ProbeLimits, probe_frontend, stream_counts
from frontend_stub import StubCosts, StubServer
from servesim.traces.errors import InputError


@pytest.mark.parametrize("field", ["http_s", "output_per_request_s", "output_step_s", "tokenize_s_per_token"])
def test_frontend_config_refuses_negative_costs(field):
    with pytest.raises(InputError, match=f"frontend.{field}"):
        FrontendConfig(**{field: -1.0})


def _frame(rows):
    cols = ["request_id", "arrival_s", "prompt_len", "output_len", "first_token_s", "finish_s", "itl_s", "status"]
    return pd.DataFrame(rows, columns=cols)


def test_bench_serve_rules_by_hand():
    req = _frame([
        # 3 tokens in 2 chunks (a 2-token chunk at 2.0): TTFT 1, E2E 2, TPOT (2-1)/2 = 0.5, one ITL gap.
        ("a", 0.0, 10, 3, 1.0, 2.0, [1.0, 0.0], "completed"),
        ("b", 1.0, 20, 2, 1.5, 3.0, [1.5], "completed"),
        ("c", 1.0, 30, 0, None, None, [], "timed_out"),
    ])
    res = bench_serve_result(req, GoodputSlo(ttft_ms=600.0))
    assert (res["completed"], res["failed"]) == (2, 1)
    assert res["duration"] == 3.0 and res["total_input_tokens"] == 30 and res["total_output_tokens"] == 5
    assert res["mean_ttft_ms"] == pytest.approx(750.0)
    assert res["mean_tpot_ms"] == pytest.approx((500.0 + 1500.0) / 2)
    assert res["mean_itl_ms"] == pytest.approx((1000.0 + 1500.0) / 2)  # the 0 gap inside a chunk is no ITL
    assert res["request_goodput"] == pytest.approx(1 / 3.0)  # only "b" meets TTFT <= 600 ms
    stages = inference_perf_stages(req, [(0.0, 1.0), (1.0, 2.0)])
    assert [(s["completed"], s["failed"]) for s in stages] == [(1, 0), (1, 1)]
    assert stages[1]["mean_time_to_first_token_ms"] == pytest.approx(500.0)


@pytest.mark.slow
def test_probe_recovers_injected_costs_from_a_loopback_server():
    # Costs large enough that scheduling noise on a busy 2-core machine stays small beside them; the
    # background streams keep the stub's loop under a third busy (32 x 1 ms per 101 ms step).
    costs = StubCosts(http_s=0.020, tokenize_s_per_token=50e-6, step_s=0.100, per_stream_s=0.001)
    limits = ProbeLimits(max_requests=100, request_timeout_s=10.0, deadline_s=90.0,
                         prompt_words=(16, 512, 1024, 2048), repeats=3)
    with StubServer(costs, max_requests=120, lifetime_s=120.0) as stub:
        measured = probe_frontend(stub.base_url, "stub", limits)
        assert stub.num_requests == measured.num_requests <= limits.max_requests
    assert measured.samples["open_streams"] == [0.0, 8.0, 32.0]
    cfg = measured.config
    assert cfg.tokenize_s_per_token == pytest.approx(50e-6, rel=0.3), measured.samples
    assert 0.018 <= cfg.http_s <= 0.04, measured.samples  # noise only ever adds time
    assert cfg.output_per_request_s == pytest.approx(0.001, rel=0.3), measured.samples


def test_probe_is_bounded_and_refuses_a_bad_url():
    with pytest.raises(InputError, match="--base-url"):
        probe_frontend("ftp://example", "m")
    with StubServer(StubCosts(), max_requests=200, lifetime_s=30.0) as stub:
        with pytest.raises(InputError, match="--max-requests"):  # refused before any request
            probe_frontend(stub.base_url, "stub", ProbeLimits(max_requests=20, prompt_words=(8, 16)))
        assert stub.num_requests == 0


def test_stream_counts_fit_the_request_cap():
    # 3 model round trips + 2 x 3 tokenize calls leave 91 of 100: N = 0 (3 probes), 8 (11), 32 (35); 64 (67) does not fit.
    assert stream_counts(ProbeLimits(max_requests=100, prompt_words=(8, 16))) == (0, 8, 32)
    assert stream_counts(ProbeLimits(max_requests=23, prompt_words=(8, 16))) == (0, 8)
    with pytest.raises(InputError, match="at least 23 requests"):
        stream_counts(ProbeLimits(max_requests=22, prompt_words=(8, 16)))


@pytest.mark.slow
def test_calibrate_frontend_command_writes_a_usable_file(tmp_path):
    from servesim.cli import _register, app

    _register()
    out = tmp_path / "frontend.yaml"
    with StubServer(StubCosts(tokenize_s_per_token=10e-6, step_s=0.05), max_requests=120, lifetime_s=90.0) as stub:
        result = CliRunner().invoke(app, ["calibrate-frontend", "--base-url", stub.base_url, "--model", "stub",
                                          "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    cfg = FrontendConfig(**data["frontend"])
    assert cfg.enabled and math.isfinite(cfg.tokenize_s_per_token)
    assert not (tmp_path / "frontend.yaml.partial").exists()


def _close_read(conn) -> None:
    """Close after reading what the client sent: a socket closed with unread bytes (a request's body
    that arrived after the one recv, as it may on a loaded machine) resets the connection, and the
    client would see a reset instead of the answer under test."""
    import socket

    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.5)
        while conn.recv(65536):
            pass
    except OSError:
        pass
    finally:
        conn.close()


class _Misbehaving:
    """A loopback server answering every request 200 with `mode`: an endless SSE stream, a body
    trickled one byte at a time, or a page that is not JSON."""

    def __init__(self, mode: str):
        import socket
        import threading

        self.mode, self.sock = mode, socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import time

        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
                if self.mode == "notjson":
                    conn.sendall(b"<html>hello</html>\n")
                while self.mode != "notjson" and not self.done.is_set():
                    if self.mode == "endless":
                        conn.sendall(b'data: {"choices": [{"text": "x"}]}\n\n' * 1000)
                    else:
                        conn.sendall(b"d")
                        time.sleep(0.05)
            except OSError:
                pass
            finally:
                _close_read(conn)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.sock.close()


# endless: a long timeout, so the size bound is what stops it (4 MiB arrive in well under a second
# on loopback, a few on a loaded CI machine); trickle: a byte every 50 ms, stopped by the 1-s timeout.
@pytest.mark.parametrize("mode, timeout_s, message", [("endless", 30.0, "was cut off"),
                                                      ("trickle", 1.0, "still arriving after 1 s")])
def test_probe_reads_are_bounded_in_size_and_time(mode, timeout_s, message):
    import time

    from servesim.frontend_probe import _Client

    with _Misbehaving(mode) as server:
        client = _Client(server.base_url, ProbeLimits(request_timeout_s=timeout_s, deadline_s=timeout_s + 5))
        t0 = time.monotonic()
        with pytest.raises(InputError, match=message):
            client.request("POST", "/v1/completions", {"stream": True})
        assert time.monotonic() - t0 < timeout_s + 2


def test_a_tokenize_answer_that_is_not_json_is_a_clear_error():
    from servesim.frontend_probe import _Client, _tokenize_probe

    with _Misbehaving("notjson") as server:
        limits = ProbeLimits(request_timeout_s=1.0, deadline_s=5.0)
        with pytest.raises(InputError, match="not a JSON object.*<html>"):
            _tokenize_probe(_Client(server.base_url, limits), "m", limits)
