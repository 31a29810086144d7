# Everything the project needs is installed from requirements*.txt into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export JAX_PLATFORMS ?= cpu

.PHONY: setup study train smoke test clean

$(VENV)/.installed: requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

setup: $(VENV)/.installed

# The main job on the embedded default (scikit-learn digits, no download): a numerics study
# (3 arms x 5 seeds) -> statistics report -> figures, in runs/study.
study: setup
	$(PY) -m analysis.study --config=configs/digits.py:study --root=runs/study --parallel 2

# One training run on the embedded default.
train: setup
	$(PY) train.py --config=configs/digits.py:cpu --workdir=runs/digits_cpu

smoke: setup
	$(PY) train.py --config=configs/digits.py:smoke --workdir=runs/digits_smoke

test: setup
	$(PY) -m pytest tests -q -n 2 --durations=15

clean:
	rm -rf runs .jax_cache .pytest_cache
