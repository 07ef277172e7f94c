# Everything a fresh machine needs: `make serve` and `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test gpu-test clean

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

clean:
	rm -rf $(VENV) .pytest_cache
