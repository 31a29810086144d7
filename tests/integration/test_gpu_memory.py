"""GPU memory on a shared GPU: the sweep's per-run memory fraction and bench_vs_torch's on-demand
allocation, set by the code itself (no GPU needed: the environment a process starts with)."""

import os
import sys

import pytest

from benchmarks import bench_step, bench_vs_torch, common
from sweeps import estimate, runner, sweep
from trainer import process

FRACTION = 'XLA_PYTHON_CLIENT_MEM_FRACTION'


@pytest.fixture
def no_memory_settings(monkeypatch):
  for name in process.MEMORY_VARIABLES:
    monkeypatch.delenv(name, raising=False)


@pytest.fixture
def gpu_host(monkeypatch):
  """The runs have a GPU JAX can use (trainer/process.gpu_runs), as on a GPU host."""
  monkeypatch.setattr(process, 'gpu_runs', lambda environ=None: True)


def test_runs_per_gpu_for_parallel_runs_and_gpu_lists():
  assert dict(runner.slot_gpus([], 4)) == {None: 4}  # --parallel 4: all four see every GPU
  assert dict(runner.slot_gpus([], 1)) == {None: 1}
  assert dict(runner.slot_gpus([0, 1, 2, 3], 4)) == {0: 1, 1: 1, 2: 1, 3: 1}  # --gpus 0,1,2,3
  assert dict(runner.slot_gpus([0, 1, 2, 3], 2)) == {0: 1, 1: 1}  # --parallel 2 takes two ids
  assert dict(runner.slot_gpus([0, 0, 1, 1, 1], 5)) == {0: 2, 1: 3}  # an id repeated: runs share it


def test_memory_fraction_splits_the_gpu_unless_alone_or_set_by_the_user(gpu_host):
  assert runner.memory_fraction(1, {}) == {}  # alone on its GPU: JAX's default
  assert runner.memory_fraction(2, {}) == {FRACTION: '0.450'}
  assert runner.memory_fraction(4, {}) == {FRACTION: '0.225'}
  assert runner.memory_fraction(3, {}) == {FRACTION: '0.300'}
  for name in process.MEMORY_VARIABLES:  # the user's setting applies to every run instead
    assert runner.memory_fraction(4, {name: 'x'}) == {}


def test_child_env_carries_the_fraction_and_keeps_the_users(
  no_memory_settings, monkeypatch, gpu_host
):
  assert runner.child_env('/r', None, sharing=4)[FRACTION] == '0.225'
  assert FRACTION not in runner.child_env('/r', 0, sharing=1)
  monkeypatch.setenv('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  env = runner.child_env('/r', None, sharing=4)
  assert FRACTION not in env and env['XLA_PYTHON_CLIENT_PREALLOCATE'] == 'false'


def test_estimate_processes_sharing_a_gpu_get_the_runs_fraction(
  tmp_path, no_memory_settings, monkeypatch, capsys, gpu_host
):
  """`--estimate --parallel 2` without --gpus: both measuring processes share the GPU as the runs
  would, each with 0.9 / 2 (before, each took JAX's default 75 %)."""

  seen = []
  monkeypatch.setattr(
    estimate, 'measure_arms', lambda runs, flags_of, envs, *_: seen.extend(envs) or 0
  )
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    "def get_sweep(arg=None):\n  return [{'seed': s} for s in (0, 1)]\n"
  )
  code = sweep.main(
    [f'--config={cfg}:smoke', f'--root={tmp_path / "study"}', '--estimate', '--parallel', '2']
  )
  capsys.readouterr()
  assert code == 0 and [env.get(FRACTION) for env in seen] == ['0.450', '0.450']
  envs = [runner.child_env('/r', gpu, n) for gpu, n in runner.slot_gpus([0, 1], 2)]
  assert [env.get(FRACTION) for env in envs] == [None, None]
  envs = [runner.child_env('/r', gpu, n) for gpu, n in runner.slot_gpus([3, 3], 2)]
  assert [env['CUDA_VISIBLE_DEVICES'] for env in envs] == ['3', '3']


def test_parallel_runs_on_one_gpu_start_with_the_fraction_recorded_in_train_log(
  tmp_path, no_memory_settings, capsys, gpu_host
):
  """`--parallel 4` without --gpus: each run's process gets 0.9 / 4, its train.log header says
  so."""
  runs = [sweep.Run({}, 'a', seed, {}, str(tmp_path / 'a' / f'seed{seed}')) for seed in range(4)]
  progress = runner.Progress(4, 0, 4)
  script = f'import os; print("fraction", os.environ.get("{FRACTION}"))'
  failures, _, _ = runner.run_all(
    runs, lambda run: [sys.executable, '-c', script], str(tmp_path), progress, 4, [], poll=0.05
  )
  assert failures == []
  for run in runs:
    header, printed = open(os.path.join(run.workdir, 'train.log')).read().strip().splitlines()
    assert header.startswith('# ') and f' {FRACTION}=0.225 {sys.executable} -c ' in header
    assert printed == 'fraction 0.225'
  capsys.readouterr()


def test_cpu_runs_get_no_gpu_memory_fraction(tmp_path, no_memory_settings, monkeypatch):
  """Runs without a GPU (JAX_PLATFORMS=cpu here) start without the fraction, and their train.log
  header names no GPU setting (before, every parallel run's header named it)."""
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  assert runner.memory_fraction(4, os.environ) == {}
  runs = [sweep.Run({}, 'a', seed, {}, str(tmp_path / 'a' / f'seed{seed}')) for seed in range(2)]
  failures, _, _ = runner.run_all(
    runs,
    lambda run: [sys.executable, '-c', 'pass'],
    str(tmp_path),
    runner.Progress(2, 0, 2),
    2,
    [],
    poll=0.05,
  )
  assert failures == []
  for run in runs:
    assert FRACTION not in open(os.path.join(run.workdir, 'train.log')).read()


def test_bench_vs_torch_allocates_on_demand_unless_told_otherwise(no_memory_settings, monkeypatch):
  common.allocate_gpu_memory_on_demand()
  assert os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] == 'false'
  assert process.memory_settings() == 'XLA_PYTHON_CLIENT_PREALLOCATE=false'
  monkeypatch.delenv('XLA_PYTHON_CLIENT_PREALLOCATE')
  assert process.memory_settings() == "JAX's default (a GPU preallocates 75 %)"
  monkeypatch.setenv(FRACTION, '0.3')
  common.allocate_gpu_memory_on_demand()
  assert 'XLA_PYTHON_CLIENT_PREALLOCATE' not in os.environ
  assert process.memory_settings() == f'{FRACTION}=0.3'


def test_bench_vs_torch_sets_it_first_and_records_it(
  no_memory_settings, monkeypatch, capsys, keep_matmul_precision
):
  """main() sets it as its first statement (before its config, torch or JAX start anything) and
  prints it in its environment line; stopped here before any step is built."""

  class Stop(Exception):
    pass

  def stop(*args, **kwargs):
    raise Stop

  monkeypatch.setattr(bench_step, 'build_step', stop)
  with pytest.raises(Stop):
    bench_vs_torch.main(['--no-compile', '--image-size', '16', '--batch', '8'])
  first = capsys.readouterr().out.splitlines()[0]
  assert '| GPU memory: XLA_PYTHON_CLIENT_PREALLOCATE=false |' in first and 'torch ' in first
