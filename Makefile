# Two entry points for a fresh machine (Python 3.11 + make): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# Until the training engine lands, the demo builds the embedded corpus and inspects it.
demo: $(STAMP)
	$(PY) data_tools/inspect_dataset.py --demo

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/bench_data.py

clean:
	rm -rf $(VENV) build *.egg-info
