"""A newcomer's first hour: train.py with a relative --workdir, `make smoke` from a fresh clone of
the committed HEAD (reusing this venv, with the package index switched off: nothing is
downloaded), the sweep's cost before it runs (--estimate), and a report whose title says what it
compares."""

import dataclasses
import itertools
import os
import re
import shlex
import subprocess
import sys
import time

import pandas as pd
import pytest
from conftest import ROOT, cpu_xla_flags

from analysis import analyse, attribute, attribution, report
from runrecord import record
from sweeps import estimate, sweep

QUICK = 'configs/digits.py:smoke,optim.freeze_epochs=0,num_epochs=1'  # one phase: one compile


def test_train_py_with_a_relative_workdir(tmp_path, subprocess_env):
  env = {**subprocess_env, 'XLA_FLAGS': cpu_xla_flags(1)}  # one CPU device: the cheapest compile
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'train.py'),
      f'--config={QUICK}',
      '--workdir=runs/relative',
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = record.read_results(str(tmp_path / 'runs' / 'relative'))
  assert saved['status'] == 'completed' and saved['step'] == saved['total_steps'] == 22
  assert 'Traceback' not in proc.stderr
  # Accuracy on the console in %, as in the reports (it was a fraction: 'acc 0.7773').
  final = 100 * saved['final']['test_accuracy']
  assert re.search(r'step 20/22 \(epoch 1/1\) loss [0-9.]+ acc [0-9]+\.[0-9]{2} % lr', proc.stderr)
  assert f'epoch 1: test_accuracy {final:.2f} % test_loss' in proc.stderr
  assert f'Done: test_accuracy {final:.2f} %, ' in proc.stderr


def test_make_smoke_from_a_fresh_clone(tmp_path, subprocess_env):
  clone = tmp_path / 'clone'
  subprocess.run(['git', 'clone', '-q', ROOT, str(clone)], check=True, timeout=120)
  env = {**subprocess_env, 'PIP_NO_INDEX': '1', 'XLA_FLAGS': cpu_xla_flags(1)}
  env.pop('PYTHONPATH')  # the clone's own code
  proc = subprocess.run(
    ['make', 'smoke', f'VENV={sys.prefix}'],
    cwd=clone,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  assert 'Done: test_accuracy' in proc.stderr
  saved = record.read_results(str(clone / 'runs' / 'digits_smoke'))
  assert saved['status'] == 'completed' and saved['config']['preset'] == 'smoke'
  status = subprocess.run(
    ['git', 'status', '--porcelain'], cwd=clone, capture_output=True, text=True, check=True
  )
  assert status.stdout == ''  # runs/ is ignored: the clone stays clean


def test_report_title_says_what_is_compared_and_setup_names_what_differs():
  rows = [
    {
      'run': f'/home/me/runs/{e}/seed{s}',
      'status': 'completed',
      'seed': s,
      'platform': 'cpu',
      'device_kind': 'cpu',
      'numerics.requested.profile': e,
      'numerics.requested.compute_dtype': 'float32',
      'config.data.name': 'digits',
      'final.test_accuracy': 0.9 + 0.001 * s + (0.002 if e == 'tpu_default' else 0.0),
    }
    for e in ('tpu_default', 'f32')
    for s in range(4)
  ]
  out = analyse.study_analysis(pd.DataFrame(rows), margin=0.5)
  out = dataclasses.replace(out, source='/home/me/runs')
  text = report.render(out, 'md')
  assert text.splitlines()[0] == '# Final test accuracy by arm: 2 arms, 4 seeds each (digits)'
  assert (
    '- arms (differ in profile; grouped by platform, device_kind, profile, compute_dtype): '
    'profile=f32 (4 seeds, 4 runs); profile=tpu_default (4 seeds, 4 runs)'
  ) in text
  assert 'runs read from /home/me/runs' in text


def test_estimate_prints_device_hours_with_its_parts(tmp_path, subprocess_env, monkeypatch, capsys):
  """The estimate counts what a run really spends: start-up and compiles included (the first
  run of an arm compiles, later ones load from the cache); before, it left them out and took
  6 min to say 0.054 device-hours for a study that took ~10 device-minutes."""
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', subprocess_env['JAX_COMPILATION_CACHE_DIR'])
  monkeypatch.setenv('XLA_FLAGS', '')
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    "def get_sweep(arg=None):\n  return [{'seed': s} for s in (0, 1, 2)]\n"
  )
  root = tmp_path / 'study'
  code = sweep.main(
    [
      f'--config={cfg}:smoke,optim.freeze_epochs=0,num_epochs=1',
      f'--root={root}',
      '--estimate',
      '--estimate-steps=2',
    ]
  )
  out = capsys.readouterr().out
  assert code == 0, out
  total = re.search(
    r'total: ([0-9.e+-]+) device-hours for 3 runs on 1 x cpu \(cpu\) per run; '
    r'about [0-9.]+ min of wall-clock at 1 run\(s\) at a time',
    out,
  )
  assert total and float(total.group(1)) > 0
  assert (
    '= Σ arms devices × (first run + (runs - 1) × later run) / 3600, a run = start-up + '
    'Σ phases (compile + steps × s/step) + evaluations × s/evaluation + checkpoints × '
    's/checkpoint'
  ) in out
  parts = re.search(
    r'parts: start-up ([0-9.e+-]+), compilation ([0-9.e+-]+), steps '
    r'([0-9.e+-]+), evaluation ([0-9.e+-]+), checkpoints ([0-9.e+-]+) device-hours',
    out,
  )
  assert parts and all(float(v) > 0 for v in parts.groups())
  assert float(parts.group(1)) + float(parts.group(2)) > float(parts.group(3))  # start-up+compile
  row = next(line for line in out.splitlines() if line.startswith('default '))
  assert row.split()[1] == '3' and row.split()[4:6] == ['22', 'x']  # runs, steps of one epoch
  assert not list(root.glob('*/seed*'))  # nothing launched


def test_estimate_measures_a_shared_program_once_and_says_what_it_does(
  tmp_path, subprocess_env, monkeypatch, capsys
):
  """Two arms that differ only in log_every_steps compile the same training program: one process
  measures both (one start-up), the second arm's step shares the first's measurement (one cold
  compile, not one per arm), and progress lines name each arm's stage as it goes."""
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', subprocess_env['JAX_COMPILATION_CACHE_DIR'])
  monkeypatch.setenv('XLA_FLAGS', '')
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    "def get_sweep(arg=None):\n  return [{'seed': 0, 'log_every_steps': n} "
    'for n in (5, 7)]\n'
  )
  code = sweep.main(
    [
      f'--config={cfg}:smoke,optim.freeze_epochs=0,num_epochs=1',
      f'--root={tmp_path / "study"}',
      '--estimate',
      '--estimate-steps=2',
    ]
  )
  out = capsys.readouterr().out
  assert code == 0, out
  assert 'measuring 2 arm(s), 1 at a time, in 1 process(es)' in out
  progress = [line for line in out.splitlines() if line.startswith('estimate: log_every_steps-')]
  assert any(
    line.startswith('estimate: log_every_steps-5: phase full: compiling') for line in progress
  )
  assert any(
    line.startswith(
      'estimate: log_every_steps-7: phase full: the program of a step measured already'
    )
    for line in progress
  ), progress
  assert not any(
    line.startswith('estimate: log_every_steps-7: phase full: compiling') for line in progress
  )


def test_estimate_formula_and_parallel_measurement(monkeypatch, capsys):
  phases = [
    {'steps': 100, 'step_s': 0.5, 'compile_s': 20.0, 'cached_compile_s': 2.0},
    {'steps': 300, 'step_s': 1.0, 'compile_s': 30.0, 'cached_compile_s': 3.0},
  ]
  m = {
    'devices': 4,
    'platform': 'gpu',
    'device_kind': 'H100',
    'startup_s': 5.0,
    'phases': phases,
    'evaluations': 3,
    'evaluation_s': 2.0,
    'evaluation_compile_s': 10.0,
    'evaluation_cached_compile_s': 1.0,
    'checkpoints': 5,
    'checkpoint_s': 0.4,
  }
  first = 5 + (20 + 30 + 10) + (100 * 0.5 + 300 * 1.0) + 3 * 2 + 5 * 0.4
  later = 5 + (2 + 3 + 1) + (100 * 0.5 + 300 * 1.0) + 3 * 2 + 5 * 0.4
  assert sum(estimate.parts(m, cached=False).values()) == pytest.approx(first)
  assert sum(estimate.parts(m, cached=True).values()) == pytest.approx(later)
  assert estimate.device_hours([('a', 10, m), ('b', 1, m)]) == pytest.approx(
    4 * (first + 9 * later + first) / 3600
  )
  # Arms are measured in len(envs) processes at a time, each in its own slot's environment, each
  # process measuring a share of the arms (its start-up and data load paid once).
  running, seen, measured = [], [], []

  def fake_group(arms, env, steps, say):
    running.append(env['SLOT'])
    seen.append(len(running))
    measured.append([slug for slug, _ in arms])
    time.sleep(0.2)
    running.remove(env['SLOT'])
    return {slug: m for slug, _ in arms}

  monkeypatch.setattr(estimate, 'measure_group', fake_group)
  runs = [sweep.Run({}, arm, s, {}, '') for arm in 'abcd' for s in range(2)]
  envs = [{'SLOT': '0'}, {'SLOT': '1'}]
  assert estimate.measure_arms(runs, lambda r: [], envs, 2) == 0
  assert max(seen) == 2 and sorted(measured) == [['a', 'c'], ['b', 'd']]
  out = capsys.readouterr().out
  assert 'measuring 4 arm(s), 2 at a time, in 2 process(es)' in out
  assert 'wall-clock at 2 run(s) at a time' in out


STATISTICS_PAGE = os.path.join(ROOT, 'docs', 'statistics.md')  # where the attribution is documented


def documented_command(module):
  """The statistics page's first `python -m <module>` command, continuation lines joined, as
  argv."""
  with open(STATISTICS_PAGE, encoding='utf-8') as f:
    text = f.read().replace('\\\n', ' ')
  line = next(line for line in text.splitlines() if line.startswith(f'python -m {module} '))
  return shlex.split(line)[3:]


def test_documented_attribution_example_uses_the_reference_levels_its_text_names():
  """The example gave only profile=native: compute_dtype's reference became bfloat16 (its first
  sorted level) while the text says float32."""
  args = attribute.parse_args(documented_command('analysis.attribute'))
  levels = {
    'platform': ('gpu', 'tpu'),
    'profile': ('native', 'bf16_noise', 'tpu_default'),
    'batchnorm_group': (0, 256),
    'compute_dtype': ('bfloat16', 'float32'),
  }
  rows = [
    {
      'run': f'/r/{i}',
      'status': 'completed',
      'reason': '',
      'seed': seed,
      'platform': platform,
      'numerics.requested.profile': profile,
      'numerics.requested.batchnorm_group': group,
      'numerics.requested.compute_dtype': dtype,
      'final.test_accuracy': 0.9,
    }
    for i, (platform, profile, group, dtype, seed) in enumerate(
      itertools.product(*levels.values(), range(2))
    )
  ]
  prep, columns, _ = attribution.select(
    pd.DataFrame(rows), args.metric, args.factors, args.seed_col
  )
  chosen = attribution.references(
    prep.runs, columns, attribution.parse_pairs(args.reference, '--reference')
  )
  assert chosen == {
    'platform': 'gpu',
    'profile': 'native',
    'batchnorm_group': '0',
    'compute_dtype': 'float32',
  }
  with open(STATISTICS_PAGE, encoding='utf-8') as f:
    assert (
      'reference level (`profile=native`, `batchnorm_group=0`, `compute_dtype=float32`'
      in ' '.join(f.read().split())
    )
