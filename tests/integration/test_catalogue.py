"""What each analysis command may write into its --out (analyse.may_write, attribute.may_write,
draw's figures: the names runrecord/files.py checks before any compute): each figure and file a
command writes is listed for that command, and every one listed is written by it on one of three
studies. Planted studies: the shipped CSV with planted predictions, a CSV crossing init and data
seeds, and run folders with training curves (no training)."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, attribute, declaration, draw, figures, inputs
from runrecord import record
from tests.conftest import ROOT

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
N, CLASSES = 360, 10


LISTED = {
  'analyse': set(analyse.may_write()),
  'attribute': set(attribute.may_write()),
  'draw': {f'{n}.{e}' for n in analyse.FIGURES for e in ('pdf', 'png')},
}


def written(folder):
  """{path under `folder`} of every file there (the lock and manifest, dot files, aside)."""
  return {
    os.path.relpath(os.path.join(where, n), folder)
    for where, _, names in os.walk(folder)
    for n in names
    if not n.startswith('.')
  }


def planted_reader(runs):
  """Predictions for each run of `runs` (inputs.read_predictions' form): seed s
  of every arm near one model of that seed, so that every pair of arms has a churn."""
  rng = np.random.default_rng(0)
  label = rng.integers(0, CLASSES, N).astype(np.int32)
  base = {s: np.where(rng.random(N) < 0.1, (label + 1) % CLASSES, label) for s in set(runs['seed'])}
  got = []
  for seed in runs['seed']:
    predicted = np.where(rng.random(N) < 0.03, (base[seed] + 2) % CLASSES, base[seed])
    p = rng.uniform(0.3, 1.0, N).astype(np.float32)
    got.append(
      (
        {
          'label': label,
          'predicted': predicted.astype(np.int32),
          'p_predicted': p,
          'p_label': np.where(predicted == label, p, p / 4).astype(np.float32),
          'fingerprint': 'e17be61d6f4e908a',
          'task': 'classification',
        },
        None,
      )
    )
  return got


@pytest.fixture(scope='module')
def shipped():
  """The shipped digits study (two platforms, declared, a native arm: every table) with planted
  predictions (the churn ladder), every pair tested too (report_pairs.csv)."""
  return analyse.study_analysis(
    inputs.read_csv(CSV),
    declaration.load(CSV.replace('.csv', '.study.json')),
    all_pairs=True,
    read_predictions=planted_reader,
  )


def crossed_csv(path):
  """A CSV whose one arm crosses 3 init seeds x 3 data seeds x 2 replicates (the variance split)."""
  rng = np.random.default_rng(1)
  rows = [
    {
      'run': f'r{i}{j}{r}',
      'status': 'completed',
      'seed': 0,
      'init_seed': i,
      'data_seed': j,
      'platform': 'cpu',
      'final.test_accuracy': 0.9 + 0.01 * i + 0.005 * j + rng.normal(0, 1e-3),
    }
    for i in range(3)
    for j in range(3)
    for r in range(2)
  ]
  pd.DataFrame(rows).to_csv(path, index=False)
  return str(path)


def curve_runs(root):
  """Run folders of two arms x 3 seeds with histories and metrics.jsonl (the training curves)."""
  for dtype in ('float32', 'bfloat16'):
    for seed in range(3):
      run = root / dtype / f's{seed}'
      req = {'compute_dtype': dtype, 'param_dtype': 'float32'}
      hist = [
        {
          'epoch': e,
          'step': 2 * e,
          'test_accuracy': 0.8 + 0.01 * e + 0.001 * seed,
          'test_loss': 1.0 / e,
          'train_loss': 0.5 / e,
        }
        for e in (1, 2, 3)
      ]
      record.write_results(
        str(run),
        {
          'status': 'completed',
          'reason': '',
          'seed': seed,
          'platform': 'cpu',
          'device_kind': 'cpu',
          'numerics': {'requested': req, 'effective': req},
          'final': {
            'test_accuracy': hist[-1]['test_accuracy'],
            'test_loss': 0.3,
            'train_loss': 0.2,
          },
          'history': hist,
          'config': {'seed': seed},
          'step': 6,
          'total_steps': 6,
          'data': {},
        },
      )
      (run / 'metrics.jsonl').write_text(
        ''.join(
          json.dumps(
            {
              'kind': 'train',
              'step': s,
              'epoch': (s + 1) // 2,
              'train_loss': 2.0 / s + 0.01 * seed,
              'train_accuracy': 1 - 1.0 / s,
            }
          )
          + '\n'
          for s in range(1, 7)
        )
      )
  return str(root)


def test_each_command_writes_exactly_what_it_lists(shipped, tmp_path):
  out = shipped
  runs = curve_runs(tmp_path / 'runs')
  for name in ('a1', 't1', 'd1'):
    os.makedirs(tmp_path / name)
  empty = pd.DataFrame(columns=['run'])
  returned = {
    'a1': analyse.write(out, empty, str(tmp_path / 'a1')),
    't1': attribute.write(out.attribution, str(tmp_path / 't1')),
    'd1': figures.study_figures(out, empty, None, str(tmp_path / 'd1')),
  }
  for name, paths in returned.items():  # the writers return what they wrote
    assert {os.path.relpath(p, tmp_path / name) for p in paths} == written(str(tmp_path / name))
  analyse.main(['--csv', crossed_csv(tmp_path / 'crossed.csv'), '--out', str(tmp_path / 'a2')])
  analyse.main(['--runs', runs, '--out', str(tmp_path / 'a3')])
  draw.main(['--runs', runs, '--out', str(tmp_path / 'd2')])
  folders = {'analyse': ('a1', 'a2', 'a3'), 'attribute': ('t1',), 'draw': ('d1', 'd2')}
  for command, names in folders.items():
    each = [written(str(tmp_path / name)) for name in names]
    for name, files in zip(names, each, strict=True):
      assert files <= LISTED[command], (command, name, sorted(files - LISTED[command]))
    missing = LISTED[command] - set().union(*each)
    assert not missing, (command, sorted(missing))


def test_a_table_without_rows_is_kept_or_skipped_as_listed(tmp_path, capsys):
  empty = pd.DataFrame(columns=['a'])
  tables = {'report_arms.csv': empty, 'report_pairs.csv': pd.DataFrame()}
  tables['report_calibration.csv'] = empty
  paths = analyse.write_csv(tables, str(tmp_path), analyse.SKIP_EMPTY, analyse.NOTES)
  assert [os.path.basename(p) for p in paths] == ['report_arms.csv']  # its header kept
  assert (tmp_path / 'report_arms.csv').read_text() == 'a\n'
  assert 'note: report_pairs.csv not written: no pairs tested' in capsys.readouterr().err
