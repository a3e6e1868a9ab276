"""simulator/kernels.py (the reference) against its mypyc build (one of the compiled build's modules,
tools/build_native.py, built by `make`): the same floats for every input.

The compiled module is the one this process imported (`servesim.simulator.kernels`, selected with the
rest of the build by servesim/_native.py); the reference is kernels.py itself, loaded from its file
under a private name. Without a build in use the comparison skips, naming why; CI sets
SERVESIM_REQUIRE_COMPILED=1, so a build that silently failed there is a failure. Whole runs on both
builds: tests/test_compiled.py runs the golden and parity tests and replays the bundled default with
SERVESIM_PURE_PYTHON=1, which selects the pure kernels too.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servesim import _native
from servesim.simulator import kernel_impl

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "simulator" / "kernels.py"


def _reference():
    """kernels.py as written, whatever this process imported as servesim.simulator.kernels."""
    spec = importlib.util.spec_from_file_location("_servesim_kernels_reference", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels = _reference()


def _compiled():
    if not kernel_impl.compiled:
        reason = _native.kernels_mode()
        if os.environ.get("SERVESIM_REQUIRE_COMPILED") == "1" and _native.PURE_ENV not in os.environ:
            pytest.fail(f"the compiled kernels must be in use here: {reason}")
        pytest.skip(f"no compiled kernels to compare with ({reason}; `make` builds them)")
    from servesim.simulator import kernels as native

    return native


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
                float(rng.uniform(0, 1e-5)), int(rng.integers(1024, 400_000)), int(rng.integers(0, 10**7)),
                float(rng.choice([0.0, 0.06095, float(rng.uniform(0, 1))])),  # the decodes' skew alpha
                int(rng.integers(0, 2)) * int(rng.integers(0, 200 * n)))  # and their skew KV tokens
        assert native.decode_step_prices(*args) == kernels.decode_step_prices(*args)



def _pricer_args(rng: np.random.Generator):
    """DenseRooflinePricer's constructor: magnitudes of real models (s/FLOP ~1e-15, bytes ~1e9)."""
    gemms = [(float(rng.uniform(1e6, 1e9)), float(rng.integers(1e6, 2e9)), float(rng.integers(1e3, 1e5)),
              1 / float(rng.uniform(1e14, 2e15)), float(rng.choice([1.0, 0.5, 0.25]))) for _ in range(int(rng.integers(2, 7)))]
    m = 1 / float(rng.uniform(1e12, 8e12))
    attn = (float(rng.uniform(1e3, 1e5)), 1 / float(rng.uniform(1e14, 2e15)), m, float(rng.uniform(0, 1e-5)),
            float(rng.integers(256, 400_000)), float(rng.integers(256, 100_000)),
            float(rng.choice([0.0, 0.06095, float(rng.uniform(0, 1))])))  # the decodes' skew alpha
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


def test_the_compiled_verify_prices_are_the_reference_float_for_float():
    native = _compiled()
    rng = np.random.default_rng(3)
    for _ in range(60):
        args = _pricer_args(rng)
        ours, theirs = native.DenseRooflinePricer(*args), kernels.DenseRooflinePricer(*args)
        for _ in range(10):
            q, n = int(rng.integers(2, 9)), int(rng.integers(0, 400))
            sums = [int(c) for c in rng.integers(0, 200_000 * max(n, 1), int(rng.integers(0, 30)))]
            rest = rng.uniform(0, 1e-3, 3).tolist()
            assert ours.verify_steps_s(q, n, sums, *rest) == theirs.verify_steps_s(q, n, sums, *rest)


def test_the_engine_uses_the_selected_build():
    from servesim.simulator import kernels as imported

    selected = kernel_impl.step_timeline
    assert selected is imported.step_timeline
    assert kernel_impl.compiled == _native.kernels_mode().startswith("compiled")
    if kernel_impl.compiled:
        assert type(selected).__name__ == "builtin_function_or_method"
    else:
        assert imported.__file__ == str(SOURCE)


def test_the_kernels_follow_the_one_switch():
    """SERVESIM_PURE_PYTHON=1 selects kernels.py as it selects the pure scheduler and engine."""
    code = "from servesim.simulator import kernel_impl, kernels; print(kernel_impl.compiled, kernels.__file__)"
    env = {**os.environ, _native.PURE_ENV: "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert res.stdout.split() == ["False", str(SOURCE)]
