"""train.py from the command line: the smoke run, and bad input failing before any compute."""

import os
import subprocess
import sys
import time

import ml_collections
import pytest

from configs import digits, validation
from tests.conftest import ROOT

TRAIN = [sys.executable, os.path.join(ROOT, 'train.py')]


def run_train(args, env, timeout=600):
  return subprocess.run(
    TRAIN + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
  )


BAD_INPUTS = [
  (['--config=configs/digits.py:warp'], "unknown preset 'warp'"),
  (
    ['--config=configs/digits.py:smoke', '--config.batch_size=60'],
    'config.batch_size=60 is not divisible by the 8 devices',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.optim.learning_rate=0.0'],
    'config.optim.learning_rate must be a finite number > 0, got 0.0',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.optim.learning_rate=-1e-3'],
    'config.optim.learning_rate must be a finite number > 0',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.model.width=1e999'],
    'config.model.width must be a finite number >= 1/64',
  ),
  (
    ['--config=configs/digits.py:smoke,optim.warmup_epochs=1e999'],
    'config.optim.warmup_epochs must be a finite number >= 0, got inf',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.optim.b1=1.0'],
    'config.optim.b1 must be a finite number in [0, 1), got 1.0',
  ),
  (
    ['--config=configs/digits.py:smoke,model.width=inf'],
    '--config=configs/digits.py:smoke,model.width=inf: config.model.width=inf: give a number',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.num_epochs=0'],
    'config.num_epochs must be a positive integer',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.optim.freeze_epochs=2'],
    'config.optim.freeze_epochs (2) must be smaller than config.num_epochs (2)',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.numerics.compute_dtype=float16'],
    'config.numerics.compute_dtype must be one of',
  ),
  (['--config=configs/digits.py:smoke', '--config.num_epochs=two'], 'num_epochs'),
  (
    ['--config=configs/digits.py:smoke', '--config.batch_size=4096'],
    'config.batch_size=4096 is larger than the 1437 training examples',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.data.image_size=4096'],  # was: 6 GB, no line
    'config.data.image_size=4096: a training step keeps at least 300.0 GiB of activations (64 '
    'images x 4,800.0 MiB of convolution outputs at 4096x4096, model.width 0.125, float32)',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.numerics.emulate=fp8'],
    'config.numerics.emulate',
  ),
  (['--config=configs/digits.py:smoke', '--config.data.flip=maybe'], 'data.flip'),
  (['--config=configs/digits.py:smoke', '--config.data.on_device=maybe'], 'data.on_device'),
  (['--config=configs/digits.py:smoke', '--config.no_such_field=1'], 'no_such_field'),
  (
    ['--config=configs/digits.py:smoke', '--config.checkpoint_every_steps=-1'],
    'config.checkpoint_every_steps must be an integer >= 0',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.distributed.initialize=maybe'],
    'config.distributed.initialize must be one of',
  ),
  (
    ['--config=configs/digits.py:smoke', '--config.distributed.process_id=1'],
    'need config.distributed.coordinator_address',
  ),
  (
    [
      '--config=configs/digits.py:smoke',
      '--config.distributed.coordinator_address=localhost:1',
      '--config.distributed.num_processes=2',
      '--config.distributed.process_id=2',
    ],
    'config.distributed.process_id must be in [0, 2)',
  ),
  (
    ['--config=configs/celeba.py:smoke', '--config.data.manual_dir='],
    'config.data.manual_dir is empty',
  ),
  (
    ['--config=configs/celeba.py:smoke', '--config.data.manual_dir=/nonexistent/celeba'],
    'lacks img_align_celeba.zip',
  ),
]


@pytest.mark.parametrize('args,message', BAD_INPUTS, ids=[m[:30] for _, m in BAD_INPUTS])
def test_bad_input_fails_fast_with_one_line(args, message, tmp_path, subprocess_env):
  workdir = tmp_path / 'w'
  start = time.time()
  proc = run_train(args + [f'--workdir={workdir}'], subprocess_env)
  assert proc.returncode != 0
  assert message in proc.stderr, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  assert not (workdir / 'checkpoints').exists()  # nothing written, nothing compiled
  assert time.time() - start < 60


@pytest.mark.parametrize(
  'name,value',
  [
    ('optim.learning_rate', float('inf')),
    ('optim.learning_rate', float('nan')),
    ('optim.weight_decay', float('nan')),
    ('optim.weight_decay', float('inf')),
    ('optim.warmup_epochs', float('nan')),
    ('optim.warmup_epochs', float('inf')),
    ('optim.b1', 1.0),
    ('optim.b2', 1.0),
    ('optim.b1', -0.1),
    ('optim.eps', 0.0),
    ('optim.eps', float('nan')),
    ('model.width', float('inf')),
    ('model.width', float('nan')),
    ('data.test_fraction', float('nan')),
    ('optim.learning_rate', '0.1'),
  ],
)
def test_non_finite_and_out_of_range_numbers_are_refused(name, value):
  """Values that would pass a plain comparison (NaN compares False) and fail at step 1 or in
  model building: one ConfigError naming the field, before anything is built."""
  # Not type-safe, as a config file's get_config may return it: a string gets through.
  config = ml_collections.ConfigDict(digits.get_config('smoke').to_dict(), type_safe=False)
  part, field = name.split('.')
  config[part][field] = value
  with pytest.raises(validation.ConfigError, match=rf'^config\.{name} must be a finite number'):
    validation.resolve(config)


CONFIG_FILES = [
  ('syntax', 'def get_config(arg=None):\n  return {\n', 'line 2:'),
  (
    'import',
    'import no_such_module\ndef get_config(arg=None):\n  return None\n',
    "ModuleNotFoundError: No module named 'no_such_module'; fix the config file",
  ),
  (
    'nan',
    'from configs import digits\ndef get_config(arg=None):\n'
    '  c = digits.get_config("smoke")\n  c.optim.weight_decay = float("nan")\n  return c\n',
    'config.optim.weight_decay must be a finite number >= 0, got nan',
  ),
]


@pytest.mark.parametrize('name,text,message', CONFIG_FILES, ids=[c[0] for c in CONFIG_FILES])
def test_broken_config_file_is_one_line_error(name, text, message, tmp_path, subprocess_env):
  path = tmp_path / f'{name}_config.py'
  path.write_text(text)
  proc = run_train([f'--config={path}', f'--workdir={tmp_path / "w"}'], subprocess_env)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and message in proc.stderr
  assert not (tmp_path / 'w').exists()


def test_unwritable_workdir_is_one_line_error(tmp_path, subprocess_env):
  if os.geteuid() == 0:
    target = '/proc/not_a_workdir'  # root can write anywhere else
  else:
    locked = tmp_path / 'locked'
    locked.mkdir(mode=0o500)
    target = str(locked / 'w')
  proc = run_train(['--config=configs/digits.py:smoke', f'--workdir={target}'], subprocess_env)
  assert proc.returncode == 2
  assert f'--workdir={target} is not writable' in proc.stderr
  assert 'Traceback' not in proc.stderr


def test_workdir_that_is_a_file_is_one_line_error(tmp_path, subprocess_env):
  target = tmp_path / 'a_file'
  target.write_text('not a folder')
  proc = run_train(['--config=configs/digits.py:smoke', f'--workdir={target}'], subprocess_env)
  assert proc.returncode == 2
  assert f'--workdir={target} is a file, not a folder' in proc.stderr.strip().splitlines()[-1]
  assert 'Traceback' not in proc.stderr and target.read_text() == 'not a folder'


def test_smoke_run_from_the_command_line(tmp_path, subprocess_env):
  """Also: with no JAX_PLATFORMS (as a user runs it), JAX's probe for a TPU prints nothing; and
  with no compilation cache (every step function compiles), the first ETA (timed from the end of
  step 1's compile) does not exceed the whole run's wall time."""
  workdir = tmp_path / 'smoke'
  env = {
    k: v
    for k, v in subprocess_env.items()
    if k not in ('JAX_PLATFORMS', 'JAX_COMPILATION_CACHE_DIR')
  }
  start = time.time()
  proc = run_train(
    ['--config=configs/digits.py:smoke', f'--workdir={workdir}', '--config.seed=3'], env
  )
  wall = time.time() - start
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'img/s' in proc.stderr and 'ETA' in proc.stderr
  assert 'Unable to initialize backend' not in proc.stderr
  h, m, s = proc.stderr.split('ETA ')[1].split()[0].split(':')
  assert int(h) * 3600 + int(m) * 60 + int(s) <= wall, proc.stderr[-3000:]
  assert (workdir / 'checkpoints').is_dir() and (workdir / 'metrics.jsonl').exists()
