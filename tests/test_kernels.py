"""simulator/kernels.py (the reference) against its mypyc build (tools/compile_kernels.py, built
by `make`): the same floats for every input, and a build is used only while it matches the source.

Without a build the comparison skips, naming why; CI sets SERVESIM_REQUIRE_COMPILED=1, so a build
that silently failed there is a failure. Whole runs on both builds: tests/test_compiled.py runs
the golden and parity tests and replays the bundled default with SERVESIM_PURE_PYTHON=1, which
selects the pure kernels too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from servesim.simulator import kernel_impl, kernels

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "simulator" / "kernels.py"


def _compiled():
    saved = os.environ.pop(kernel_impl.PURE_ENV, None)
    try:
        path, reason = kernel_impl.find_build(ROOT, SOURCE)
    finally:
        if saved is not None:
            os.environ[kernel_impl.PURE_ENV] = saved
    if path is None:
        if os.environ.get("SERVESIM_REQUIRE_COMPILED") == "1":
            pytest.fail(f"the compiled kernels must build here: {reason}")
        pytest.skip(f"no compiled kernels to compare with ({reason}; `make` builds them)")
    return kernel_impl._load(path)


def _timeline_cases(rng: np.random.Generator):
    for _ in range(300):
        k = int(rng.integers(0, 80))
        gpu = (rng.lognormal(-5.0, 1.0, k)).tolist()  # ~7 ms steps, some far longer
        now = float(rng.uniform(0.0, 4000.0))
        free_at = now + float(rng.uniform(-0.01, 0.02))
        later = now + float(rng.uniform(0.0, 1.0)) if rng.random() < 0.5 else math.inf
        deadline = now + float(rng.uniform(0.0, 1.0)) if rng.random() < 0.3 else math.inf
        cpu = float(rng.uniform(0.0, 0.003)) if rng.random() < 0.8 else 0  # an int zero too
        yield now, gpu, int(rng.integers(0, 2)), cpu, later, deadline, free_at


def test_the_compiled_timeline_is_the_reference_float_for_float():
    native = _compiled()
    rng = np.random.default_rng(0)
    for args in _timeline_cases(rng):
        assert native.step_timeline(*args) == kernels.step_timeline(*args)


def test_the_compiled_decode_prices_are_the_reference_float_for_float():
    native = _compiled()
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 512))
        args = (int(rng.integers(n, 4_000_000)), n, int(rng.integers(0, 300)), int(rng.integers(1, 128)),
                *rng.uniform(1e-6, 1e-3, 3).tolist(), float(rng.uniform(0, 1e-3)),
                float(rng.uniform(1e3, 1e6)), 1 / float(rng.uniform(1e14, 2e15)), 1 / float(rng.uniform(1e12, 8e12)),
                float(rng.uniform(0, 1e-5)), int(rng.integers(1024, 400_000)), int(rng.integers(0, 10**7)))
        assert native.decode_step_prices(*args) == kernels.decode_step_prices(*args)



def _pricer_args(rng: np.random.Generator):
    """DenseRooflinePricer's constructor: magnitudes of real models (s/FLOP ~1e-15, bytes ~1e9)."""
    gemms = [(float(rng.uniform(1e6, 1e9)), float(rng.integers(1e6, 2e9)), float(rng.integers(1e3, 1e5)),
              1 / float(rng.uniform(1e14, 2e15)), float(rng.choice([1.0, 0.5, 0.25]))) for _ in range(int(rng.integers(2, 7)))]
    m = 1 / float(rng.uniform(1e12, 8e12))
    attn = (float(rng.uniform(1e3, 1e5)), 1 / float(rng.uniform(1e14, 2e15)), m, float(rng.uniform(0, 1e-5)),
            float(rng.integers(256, 400_000)), float(rng.integers(256, 100_000)))
    head = (float(rng.uniform(1e8, 2e9)), float(rng.integers(1e8, 4e9)), float(rng.integers(1e3, 1e6)),
            float(rng.integers(1e5, 1e7)), float(rng.integers(1e3, 4e4)))
    return (int(rng.integers(1, 128)), gemms, m, float(rng.uniform(0, 1e-5)), bool(rng.integers(0, 2)), attn,
            float(rng.uniform(1e3, 1e6)), int(rng.integers(0, 8)), head, 1 / float(rng.uniform(1e14, 2e15)),
            bool(rng.integers(0, 2)))


def test_the_compiled_roofline_pricer_is_the_reference_float_for_float():
    native = _compiled()
    rng = np.random.default_rng(2)
    for _ in range(60):
        args = _pricer_args(rng)
        ours, theirs = native.DenseRooflinePricer(*args), kernels.DenseRooflinePricer(*args)
        for _ in range(20):
            size = int(rng.integers(0, 200))
            new = tuple(int(n) if rng.random() < 0.2 else 1 for n in rng.integers(0, 9000, size))
            ctx = tuple(int(c) for c in rng.integers(0, 200_000, size))
            rest = (int(rng.integers(0, size + 1)), *rng.uniform(0, 1e-3, 3).tolist())
            assert ours.step_s(new, ctx, *rest) == theirs.step_s(new, ctx, *rest)


def test_the_engine_uses_the_selected_build():
    selected = kernel_impl.step_timeline
    if kernel_impl.mode.startswith("compiled"):
        assert selected is not kernels.step_timeline
        assert type(selected).__name__ == "builtin_function_or_method"
    else:
        assert selected is kernels.step_timeline


def test_the_switch_is_the_compiled_schedulers():
    from servesim import _native

    assert kernel_impl.PURE_ENV == _native.PURE_ENV


def test_a_stale_missing_or_switched_off_build_is_not_used(tmp_path, monkeypatch):
    source = tmp_path / "kernels.py"
    source.write_text(SOURCE.read_text())
    monkeypatch.delenv(kernel_impl.PURE_ENV, raising=False)
    assert kernel_impl.find_build(tmp_path, source) == (None, "no compiled build (run make)")
    build = tmp_path / kernel_impl.BUILD_DIR
    build.mkdir(parents=True)
    suffix = kernel_impl.compiled_path(tmp_path).name[len(kernel_impl.MODULE):]
    (build / kernel_impl.MANIFEST).write_text(f"source={kernel_impl.source_digest(source)}\next_suffix={suffix}\n")
    assert kernel_impl.find_build(tmp_path, source) == (None, "no compiled build (run make)")  # no module file
    kernel_impl.compiled_path(tmp_path).write_bytes(b"")
    assert kernel_impl.find_build(tmp_path, source) == (kernel_impl.compiled_path(tmp_path), "compiled (mypyc)")
    source.write_text(SOURCE.read_text() + "\n# edited\n")
    path, reason = kernel_impl.find_build(tmp_path, source)
    assert path is None and reason.startswith("stale compiled build: simulator/kernels.py changed")
    source.write_text(SOURCE.read_text())
    (build / kernel_impl.MANIFEST).write_text(f"source={kernel_impl.source_digest(source)}\next_suffix=.other.so\n")
    assert kernel_impl.find_build(tmp_path, source)[1].startswith("stale compiled build: built for another Python")
    monkeypatch.setenv(kernel_impl.PURE_ENV, "1")
    assert kernel_impl.find_build(tmp_path, source) == (None, f"{kernel_impl.PURE_ENV} is set")
