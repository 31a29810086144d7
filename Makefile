# The documented way to run the project: every target installs what it needs into $(VENV) first.
#   study, train, smoke: the core only (requirements.txt, ~1 GiB installed)
#   test: the core, CelebA preparation, libtpu, the test/benchmark packages and the lint tools
#     (requirements-test.txt)
#   lint: formatting, lint, spelling and types (ruff, codespell, mypy; settings in pyproject.toml)
#   setup-tpu: the core and JAX's TPU runtime (requirements-tpu.txt): a TPU VM, or TPU programs
#     compiled on this host (python -m sweeps.preflight, docs/tpu.md)
# VENV=/abs/path/venv uses an existing virtual environment; pip then installs nothing that is
# already there at the pinned version (it does not contact the index for those).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install -q --disable-pip-version-check
export JAX_PLATFORMS ?= cpu

.PHONY: setup setup-test setup-tpu study train smoke test lint clean

# The pins need Python >= 3.11: on a TPU VM image with 3.10, PYTHON="$$(uv python find 3.11)"
# after `uv python install 3.11` (docs/tpu.md, "From a fresh TPU VM").
$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "make: $(PYTHON) is Python " + sys.version.split()[0] + "; the pins need 3.11+: see docs/tpu.md (uv python install 3.11)")'
	@echo "[make] creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

setup: | $(PY)
	@echo "[make] installing requirements.txt into $(VENV): about 2 min the first time, seconds after"
	$(PIP_INSTALL) -r requirements.txt
	@echo "[make] installed"

setup-test: | $(PY)
	@echo "[make] installing requirements-test.txt into $(VENV): a few minutes the first time"
	$(PIP_INSTALL) -r requirements-test.txt

setup-tpu: | $(PY)
	@echo "[make] installing requirements-tpu.txt into $(VENV): libtpu is a 213 MB wheel"
	$(PIP_INSTALL) -r requirements-tpu.txt
	@echo "[make] installed"

# The main job on the embedded default (scikit-learn digits, no download): a numerics study
# (8 arms x 6 seeds) -> statistics report -> attribution -> figures, in runs/study (~6 min on 2 cores).
study: setup
	@echo "[make] starting the study: progress lines follow; the ETA appears once a run is measured"
	$(PY) -m sweeps.run_study --config=configs/digits.py:study --root=runs/study --parallel 2

# One training run on the embedded default (a few minutes on 2 cores).
train: setup
	$(PY) train.py --config=configs/digits.py:cpu --workdir=runs/digits_cpu

# Seconds: every phase of a run (frozen, unfrozen, evaluation, checkpoint), learns little.
smoke: setup
	$(PY) train.py --config=configs/digits.py:smoke --workdir=runs/digits_smoke

test: setup-test
	$(PY) -m pytest tests -q -n 3 --dist worksteal --durations=15

# The checks CI runs before the tests (.ci/run); pre-commit runs the same on each commit.
lint: setup-test
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m codespell_lib
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf runs .jax_cache .pytest_cache .mypy_cache .ruff_cache
