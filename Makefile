# One command each on a fresh machine: `make demo` runs `bayespca demo`,
# `make test` the test suite, `make bench` the benchmarks, `make notebook`
# opens the notebooks in JupyterLab, `make notebooks` re-executes them (small
# mode) and stores their outputs. Each creates .venv with a Python >= 3.12 on
# first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench docs lint clean venv notebook notebooks

venv: $(STAMP)

$(STAMP): pyproject.toml
	@bash tools/make_venv.sh $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bayespca demo --out bayespca-demo

# Two worker processes, one test file each at a time (a file's module-scoped fits are made
# once): the suite's wall on the 2-core CI machine is about 0.7 of one process's.
test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses 2 --dist loadfile

docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

lint: $(STAMP)
	$(VENV)/bin/ruff check .

notebook: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

notebooks: $(STAMP)
	$(PY) tools/run_notebooks.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
