"""Test session setup: CPU with 8 virtual devices, and a persistent compilation cache.

The flags must be set before JAX initialises its backend, hence at import of this file. The GPU
tier (tests/gpu) is the exception: `GPU_TESTS=1 python -m pytest tests/gpu` leaves JAX's platform
alone, so those tests run on the machine's GPU (elsewhere they are skipped).
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
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# A test runner started in the background by a shell without job control inherits SIGINT ignored,
# and so would every train.py it starts (the trainer keeps an ignored signal ignored, as a
# background job should): the tests that send SIGINT need it deliverable.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

import jax  # noqa: E402
import pytest  # noqa: E402

# Tiers by cost, one per test file (`pytest -m unit`, `-m "not e2e"`, ...; pytest.ini registers
# them): unit = no model is built (statistics and analysis on planted tables, config and plan
# checks, pure functions); integration = JAX in this process (model parts, one compiled step, a
# benchmark's main at a toy size); e2e = whole runs: training, or subprocesses (train.py, the
# CLIs, the benchmarks); tpu = TPU programs compiled on this CPU with libtpu (sweeps/preflight.py;
# skipped where libtpu is not installed); gpu = tests/gpu (skipped without GPU_TESTS=1).
# tests/test_tiers.py checks that every test file is in exactly one tier.
TIERS = {
    'unit': ('test_analysis_scale.py', 'test_answer.py', 'test_attribution.py', 'test_batching.py',
             'test_contrasts.py', 'test_faults_metrics.py', 'test_figures.py', 'test_findings.py',
             'test_gap.py', 'test_imports.py', 'test_record.py', 'test_stats.py',
             'test_sweep_checks.py', 'test_sweep_shared_root.py', 'test_throughput.py',
             'test_tiers.py', 'test_docs.py', 'test_agreement.py', 'test_calibration.py',
             'test_variance.py', 'test_platform_pairs.py', 'test_study_designs.py',
             'test_first_page.py', 'test_figures_context.py', 'test_declaration.py',
             'test_columns.py', 'test_hlo_census.py', 'test_readme_claims.py',
             'test_analysis_rooms.py', 'test_references.py'),
    'integration': ('test_bench_determinism.py', 'test_bench_epoch.py', 'test_conv_impl.py',
                    'test_data_parallel.py', 'test_emulate_fast.py', 'test_gpu_memory.py',
                    'test_loss.py', 'test_lowering.py', 'test_memory_checks.py', 'test_model.py',
                    'test_numerics.py', 'test_optim.py', 'test_pool.py', 'test_profiles.py',
                    'test_cpu_platform.py', 'test_hostile_analysis.py', 'test_run_predictions.py',
                    'test_run_identity.py', 'test_hostile_pass36.py', 'test_abstract_build.py',
                    'test_split_seed_arms.py', 'test_catalogue.py', 'test_config_owner.py',
                    'test_mesh_and_optimizer.py'),
    'e2e': ('test_benchmarks.py', 'test_celeba.py', 'test_cli.py', 'test_divergence.py',
            'test_faults_resume.py', 'test_faults_stop.py', 'test_faults_workdir.py',
            'test_gpu_evidence.py', 'test_multihost.py', 'test_newcomer.py', 'test_pretrained.py',
            'test_reliability.py', 'test_sweep.py', 'test_sweep_quoting.py', 'test_train.py',
            'test_predictions.py', 'test_inputs.py', 'test_first_hour.py', 'test_three_platforms.py',
            'test_report_output.py', 'test_train_inputs.py', 'test_tpu_chips.py', 'test_stop_bound.py',
            'test_commands.py'),
    'tpu': ('test_tpu_preflight.py',),
    'gpu': ('gpu/test_gpu_tier.py',),
}
TESTS = pathlib.Path(__file__).resolve().parent


def tier_of(path):
  """The tier of a test file (a path), or None for a file no tier lists."""
  name = pathlib.Path(path).resolve().relative_to(TESTS).as_posix()
  return next((tier for tier, files in TIERS.items() if name in files), None)


def pytest_collection_modifyitems(items):
  """Each test gets its file's tier as a marker."""
  for item in items:
    tier = tier_of(item.path)
    if tier:
      item.add_marker(getattr(pytest.mark, tier))


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
def fast_compile():
  """Compiled without most optimisations: the same program and semantics, a fraction of the CPU
  time (for tests of what a step computes or contains, not of its speed)."""
  before = jax.config.read('jax_disable_most_optimizations')
  jax.config.update('jax_disable_most_optimizations', True)
  yield
  jax.config.update('jax_disable_most_optimizations', before)
