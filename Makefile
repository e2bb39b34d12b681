# One command each on a fresh machine: `make test` runs the test suite,
# `make bench` runs the benchmarks. Both create .venv with Python >= 3.12.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@bash tools/make_venv.sh $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_pca.py

clean:
	rm -rf $(VENV) .pytest_cache
