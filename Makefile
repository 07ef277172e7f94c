# Everything a fresh machine needs: `make serve` and `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test kernel-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: this version is the CPU build on these machines' disk
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

serve: $(VENV)/.installed
	$(BIN)/kestrel serve $(ARGS)

test: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --timeout 600 tests $(ARGS)

# The GPU kernel tests on this machine's CPU under Triton's interpreter, with every kernel specialisation they launch
# also compiled for sm_90 (the H100 / H200), PDL off and on: the compile errors the interpreter does not see
# (tests/gpu/sm90.py; Triton comes with the dev extras, pinned to the device image's version).
kernel-check: $(VENV)/.installed
	TRITON_INTERPRET=1 KESTREL_SM90_COMPILE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests/gpu $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
