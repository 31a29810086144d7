"""A newcomer's first commands work as written: train.py with a relative --workdir, and `make smoke`
from a fresh clone of the committed HEAD (reusing this venv, with the package index switched off:
nothing is downloaded)."""

import os
import subprocess
import sys

from conftest import ROOT
from trainer import record

QUICK = 'configs/digits.py:smoke,optim.freeze_epochs=0,num_epochs=1'  # one phase: one compile


def test_train_py_with_a_relative_workdir(tmp_path, subprocess_env):
  env = {**subprocess_env, 'XLA_FLAGS': ''}  # one CPU device: the cheapest compile
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'train.py'), f'--config={QUICK}',
                         '--workdir=runs/relative'], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = record.read_results(str(tmp_path / 'runs' / 'relative'))
  assert saved['status'] == 'completed' and saved['step'] == saved['total_steps'] == 22
  assert 'Traceback' not in proc.stderr


def test_make_smoke_from_a_fresh_clone(tmp_path, subprocess_env):
  clone = tmp_path / 'clone'
  subprocess.run(['git', 'clone', '-q', ROOT, str(clone)], check=True, timeout=120)
  env = {**subprocess_env, 'PIP_NO_INDEX': '1', 'XLA_FLAGS': ''}
  env.pop('PYTHONPATH')  # the clone's own code
  proc = subprocess.run(['make', 'smoke', f'VENV={sys.prefix}'], cwd=clone, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  assert 'Done: test_accuracy' in proc.stderr
  saved = record.read_results(str(clone / 'runs' / 'digits_smoke'))
  assert saved['status'] == 'completed' and saved['config']['preset'] == 'smoke'
  status = subprocess.run(['git', 'status', '--porcelain'], cwd=clone, capture_output=True,
                          text=True, check=True)
  assert status.stdout == ''  # runs/ is ignored: the clone stays clean
