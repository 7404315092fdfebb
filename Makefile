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

# Black-box pretraining of the built-in GPT on the embedded demo corpus (~3 min on 2 CPU cores).
demo: $(STAMP)
	$(VENV)/bin/rapidgpt --task pretraining --train-iters 300 --lr 1.5e-3 --min-lr 1e-4 \
		--lr-warmup-iters 30 --lr-decay-style cosine --hidden-dropout 0 --attention-dropout 0 \
		--eval-interval 100 --eval-iters 5 --log-interval 20 --top-k 8 --temperature 0.8

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 tests

bench: $(STAMP)
	$(PY) benchmarks/bench_data.py
	$(PY) benchmarks/bench_pretrain.py

clean:
	rm -rf $(VENV) build *.egg-info
