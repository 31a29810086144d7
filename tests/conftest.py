"""Test session setup: CPU with 8 virtual devices, a persistent compilation cache, and XLA's
backend optimisation at level 1 (in XLA_FLAGS, so the tests' subprocesses compile alike). Measured
on 2 cores, the smoke preset's train.py took 11-12 s (cache warm) and 21-22 s (cold) at level 1
against 17-19 s and 25 s at level 0 (JAX_DISABLE_MOST_OPTIMIZATIONS), whose steps ran at a third of
the speed; the default, level 2, compiles for longer.

The flags must be set before JAX initialises its backend, hence at import of this file. The GPU
tier (tests/gpu) is the exception: `GPU_TESTS=1 python -m pytest tests/gpu` leaves JAX's platform
and optimisations alone, so those tests run on the machine's GPU (elsewhere they are skipped).
"""

import os
import pathlib
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
GPU_TIER = os.environ.get('GPU_TESTS') == '1'
if not GPU_TIER:
  os.environ['JAX_PLATFORMS'] = 'cpu'
OPT_LEVEL = '' if GPU_TIER else '--xla_backend_optimization_level=1'
DEVICE_COUNT = '--xla_force_host_platform_device_count='
# The user's own XLA_FLAGS, without the two this file adds: it runs twice, as pytest's `conftest`
# and as the `tests.conftest` test modules import, and the second run finds them already there.
USER_XLA_FLAGS = ' '.join(
  f
  for f in os.environ.get('XLA_FLAGS', '').split()
  if not f.startswith(DEVICE_COUNT) and f != OPT_LEVEL
)


def cpu_xla_flags(devices):
  """XLA_FLAGS for a subprocess on `devices` CPU devices at the tests' optimisation level, after
  the user's own flags."""
  return f'{USER_XLA_FLAGS} {DEVICE_COUNT}{devices} {OPT_LEVEL}'.strip()


os.environ['XLA_FLAGS'] = cpu_xla_flags(8)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# The tests' subprocesses keep every compiled program in the persistent cache (JAX's default keeps
# those that compiled for over 1 s): a warm smoke run of train.py compiles 38 smaller programs
# again otherwise, 1.6 s of its 8 s. This process keeps its threshold (below).
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'

# A test runner started in the background by a shell without job control inherits SIGINT ignored
# (under nohup, SIGHUP), and so would every train.py it starts (the trainer keeps an ignored signal
# ignored, as a background job should): the tests that send them need them deliverable.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
  signal.signal(signal.SIGHUP, signal.SIG_DFL)

import jax  # noqa: E402 (imported once JAX_PLATFORMS and XLA_FLAGS above are set)
import pytest  # noqa: E402 (after the environment, with jax)

# Tiers by cost, one folder each (`pytest tests/unit` or `-m unit`; pyproject.toml registers the
# markers): unit = no model is built; integration = JAX in this process; e2e = whole runs or
# subprocesses; tpu = TPU programs compiled here with libtpu; gpu = GPU_TESTS=1 on a GPU machine.
TIERS = ('unit', 'integration', 'e2e', 'tpu', 'gpu')
pytest_plugins = ('tests.support.celeba_data',)


def pytest_collection_modifyitems(items):
  """Each test gets its folder's tier as a marker; the costly tiers first, so that under
  pytest-xdist the longest tests start early and the short ones fill the end."""
  for item in items:
    tier = pathlib.Path(item.path).parent.name
    if tier in TIERS:
      item.add_marker(getattr(pytest.mark, tier))
  first = ('e2e', 'integration', 'tpu')
  items.sort(key=lambda i: (first + (i.path.parent.name,)).index(i.path.parent.name))


CACHE_DIR = os.environ.get('TEST_JAX_CACHE', os.path.join(ROOT, '.jax_cache'))
jax.config.update('jax_compilation_cache_dir', CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


@pytest.fixture
def subprocess_env():
  """Environment for running train.py in a subprocess: CPU, 8 devices, the shared cache."""
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT
  env['JAX_COMPILATION_CACHE_DIR'] = CACHE_DIR
  return env


@pytest.fixture
def keep_matmul_precision():
  """The benchmarks set jax_default_matmul_precision (as train.py does); restore it after."""
  before = jax.config.jax_default_matmul_precision
  yield
  jax.config.update('jax_default_matmul_precision', before)
