"""A newcomer's first hour: train.py with a relative --workdir, `make smoke` from a fresh clone of
the committed HEAD (reusing this venv, with the package index switched off: nothing is
downloaded), and a report whose title says what it compares."""

import os
import subprocess
import sys

import pandas as pd

from analysis import stats, style
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


def test_report_title_says_what_is_compared_and_setup_names_what_differs():
  rows = [{'run': f'/home/me/runs/{e}/seed{s}', 'status': 'completed', 'seed': s, 'platform': 'cpu',
           'device_kind': 'cpu', 'numerics.requested.emulate': e,
           'numerics.requested.compute_dtype': 'float32', 'config.data.name': 'digits',
           'final.test_accuracy': 0.9 + 0.001 * s + (0.002 if e == 'bf16' else 0.0)}
          for e in ('bf16', 'f32') for s in range(4)]
  out = stats.analyse(pd.DataFrame(rows), margin=0.5)
  out['source'] = '/home/me/runs'
  text = style.render(out, 'md')
  assert text.splitlines()[0] == '# Final test accuracy by arm: 2 arms, 4 seeds each (digits)'
  assert ('- arms (differ in emulate; grouped by platform, device_kind, compute_dtype, emulate): '
          'emulate=bf16 (4 seeds, 4 runs); emulate=f32 (4 seeds, 4 runs)') in text
  assert 'runs read from /home/me/runs' in text
