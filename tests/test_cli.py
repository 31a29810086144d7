"""train.py from the command line: the smoke run, and bad input failing before any compute."""

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

TRAIN = [sys.executable, os.path.join(ROOT, 'train.py')]


def run_train(args, env, timeout=600):
  return subprocess.run(TRAIN + args, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


BAD_INPUTS = [
    (['--config=configs/digits.py:warp'], "unknown preset 'warp'"),
    (['--config=configs/digits.py:smoke', '--config.batch_size=60'],
     'config.batch_size=60 is not divisible by the 8 devices'),
    (['--config=configs/digits.py:smoke', '--config.optim.learning_rate=0.0'],
     'config.optim.learning_rate must be > 0'),
    (['--config=configs/digits.py:smoke', '--config.optim.learning_rate=-1e-3'],
     'config.optim.learning_rate must be > 0'),
    (['--config=configs/digits.py:smoke', '--config.num_epochs=0'],
     'config.num_epochs must be a positive integer'),
    (['--config=configs/digits.py:smoke', '--config.optim.freeze_epochs=2'],
     'config.optim.freeze_epochs (2) must be smaller than config.num_epochs (2)'),
    (['--config=configs/digits.py:smoke', '--config.numerics.compute_dtype=float16'],
     'config.numerics.compute_dtype must be one of'),
    (['--config=configs/digits.py:smoke', '--config.num_epochs=two'], 'num_epochs'),
    (['--config=configs/digits.py:smoke', '--config.batch_size=4096'],
     'config.batch_size=4096 is larger than the 1437 training examples'),
    (['--config=configs/digits.py:smoke', '--config.numerics.emulate=fp8'],
     'config.numerics.emulate'),
    (['--config=configs/digits.py:smoke', '--config.data.flip=maybe'], 'data.flip'),
    (['--config=configs/digits.py:smoke', '--config.data.on_device=maybe'], 'data.on_device'),
    (['--config=configs/digits.py:smoke', '--config.no_such_field=1'], 'no_such_field'),
    (['--config=configs/digits.py:smoke', '--config.checkpoint_every_steps=-1'],
     'config.checkpoint_every_steps must be an integer >= 0'),
    (['--config=configs/digits.py:smoke', '--config.distributed.initialize=maybe'],
     'config.distributed.initialize must be one of'),
    (['--config=configs/digits.py:smoke', '--config.distributed.process_id=1'],
     'need config.distributed.coordinator_address'),
    (['--config=configs/digits.py:smoke', '--config.distributed.coordinator_address=localhost:1',
      '--config.distributed.num_processes=2', '--config.distributed.process_id=2'],
     'config.distributed.process_id must be in [0, 2)'),
    (['--config=configs/celeba.py:smoke', "--config.data.manual_dir="],
     'config.data.manual_dir is empty'),
    (['--config=configs/celeba.py:smoke', '--config.data.manual_dir=/nonexistent/celeba'],
     'lacks img_align_celeba.zip'),
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
  assert f'--workdir={target} is not writable' in proc.stderr.strip().splitlines()[-1]
  assert 'Traceback' not in proc.stderr and target.read_text() == 'not a folder'


def test_smoke_run_from_the_command_line(tmp_path, subprocess_env):
  workdir = tmp_path / 'smoke'
  proc = run_train(['--config=configs/digits.py:smoke', f'--workdir={workdir}',
                    '--config.seed=3'], subprocess_env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'img/s' in proc.stderr and 'ETA' in proc.stderr
  assert (workdir / 'checkpoints').is_dir() and (workdir / 'metrics.jsonl').exists()
