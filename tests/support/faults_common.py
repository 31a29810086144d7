"""Shared by the fault tests (test_reliability.py, test_faults_*.py): the smoke run they break, and
how they run train.py and compare its results."""

import hashlib
import json
import os
import subprocess
import sys

from configs import common, digits, validation
from runrecord import record
from tests.conftest import ROOT
from tests.support import commands
from trainer import train

TRAIN = [sys.executable, os.path.join(ROOT, 'train.py')]
# train.py with TRAIN_FAULT's faults installed from the test side (tests/support/fault_injection.py)
FAULT_TRAIN = [sys.executable, os.path.join(ROOT, 'tests', 'support', 'fault_train.py')]
EVERY = 4  # checkpoint_every_steps: 22 steps per epoch, so mid-epoch steps 4, 8, ..., 40
SMOKE_ARGS = ['--config=configs/digits.py:smoke', f'--config.checkpoint_every_steps={EVERY}']


def smoke_config(**overrides):
  """The smoke run's resolved config, with `overrides` ({dotted field: value}) applied first."""
  c = digits.get_config('smoke')
  c.checkpoint_every_steps = EVERY
  return validation.resolve(common.apply_overrides(c, overrides.items()))


def reference_run(tmp_path_factory):
  """(workdir, results) of the uninterrupted smoke run the fault tests compare with, trained in this
  process once per test session and shared by test_reliability.py and test_faults_stop.py; nothing
  may write into it (copy it first)."""

  def make(folder):
    train.train_and_evaluate(smoke_config(), str(folder / 'reference'))

  workdir = commands.once_per_session(tmp_path_factory, 'fault_reference', make) / 'reference'
  return workdir, record.read_results(str(workdir))


def run_train(args, env, fault=None, timeout=240):
  env = dict(env)
  if fault:
    env['TRAIN_FAULT'] = fault
  return subprocess.run(
    (FAULT_TRAIN if fault else TRAIN) + args,
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def without_wall_time(results):
  results = json.loads(json.dumps(results))  # as saved: tuples become lists
  out = {
    k: v for k, v in results.items() if k not in ('wall_time_s', 'run_id')
  }  # run_id: each run's own
  out['history'] = [{k: v for k, v in h.items() if k != 'wall_time_s'} for h in results['history']]
  return out


def metric_records(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return [
    {k: v for k, v in json.loads(line).items() if k not in ('wall_time_s', 'images_per_sec')}
    for line in lines
  ]


def tree_hash(folder):
  digest = hashlib.sha256()
  for path in sorted(p for p in folder.rglob('*') if p.is_file()):
    digest.update(str(path.relative_to(folder)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


def saved_steps(workdir):
  return sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())


def last_line(stderr):
  """The last line of a run's stderr, and whether everything before it is an absl INFO/WARNING
  log line (no traceback, no library error dump)."""
  lines = stderr.strip().splitlines()
  only_logs = all(line[:1] in ('I', 'W') and ']' in line for line in lines[:-1])
  return lines[-1], only_logs
