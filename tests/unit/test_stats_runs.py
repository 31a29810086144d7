"""analysis.inputs and the report of analysis.analyse on fake Orbax run folders and CSVs:
replicates, failed and running runs, non-finite metrics, the report's order, the CLI's formats and
one-line errors (no training)."""

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, inputs, stats
from runrecord import record
from tests.support.planted_runs import fake_results
from tests.support.planted_stats import csv_tables, frame, write_published


def test_margin_and_its_reason_are_printed_and_overrides_say_so(tmp_path, capsys):
  assert stats.margin_choice(None, None, 0.5, 'one test image is 0.28 pp') == (
    0.5,
    'one test image is 0.28 pp',
  )
  margin, why = stats.margin_choice(0.3, 'tighter', 0.5, 'one test image is 0.28 pp')
  assert margin == 0.3 and why == (
    'from --margin: tighter; the study declares 0.5 pp: one test image is 0.28 pp'
  )
  assert stats.margin_choice() == (stats.DEFAULT_MARGIN, stats.UNDECLARED)
  write_published(tmp_path / 'p.csv', with_seeds=False)
  analyse.main(['--csv', str(tmp_path / 'p.csv'), '--metric', 'accuracy'])
  assert f'equivalence margin: ±0.5 pp ({stats.UNDECLARED})' in capsys.readouterr().out
  analyse.main(
    [
      '--csv',
      str(tmp_path / 'p.csv'),
      '--metric',
      'accuracy',
      '--margin',
      '0.3',
      '--margin-reason',
      'half the GPU sd',
    ]
  )
  assert 'equivalence margin: ±0.3 pp (from --margin: half the GPU sd)' in capsys.readouterr().out


def make_runs(root):
  """Two GPU arms (float32 deterministic, bfloat16 not) + a duplicate, a failed and a running
  run."""
  for seed in range(4):
    record.write_results(f'{root}/f32/s{seed}', fake_results(seed, 0.80 + 0.001 * seed))
    record.write_results(
      f'{root}/bf16/s{seed}', fake_results(seed, 0.78 + 0.002 * seed, dtype='bfloat16', det=False)
    )
  # same value (deterministic), another run: its own wall time (a copy would be counted once)
  record.write_results(f'{root}/f32/s1_again', {**fake_results(1, 0.801), 'wall_time_s': 2.0})
  record.write_results(f'{root}/bf16/s2_again', fake_results(2, 0.70, dtype='bfloat16', det=False))
  record.write_results(f'{root}/f32/s9', fake_results(9, 0.1, status='failed'))
  record.write_results(f'{root}/f32/s8', fake_results(8, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.803, step=10), step=10)  # finished later


def test_orbax_runs_replicates_and_failed_runs(tmp_path):
  make_runs(tmp_path)
  runs, hist = inputs.load(str(tmp_path))
  assert len(runs) == 13 and list(runs['run']) == sorted(runs['run'])
  assert runs.set_index('run').loc[f'{tmp_path}/f32/s7', 'status'] == 'completed'  # latest step
  assert {
    'numerics.requested.compute_dtype',
    'config.model.width',
    'final.test_loss',
    'config.model.reinit',
  } <= set(runs.columns)
  assert set(hist.columns) >= {'run', 'epoch', 'test_accuracy'} and len(hist) == 26
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert list(out.arms['n']) == [4, 5] and list(out.arms['n_runs']) == [5, 6]
  reps = out.replicates.set_index('seed')
  assert (
    reps.loc[1, 'runs'] == f'{tmp_path}/f32/s1, {tmp_path}/f32/s1_again'
    and reps.loc[1, 'identical']
  )
  assert not reps.loc[2, 'identical'] and reps.loc[2, 'mean'] == pytest.approx((78.4 + 70.0) / 2)
  units = out.units.set_index(['arm', 'seed'])['value']
  assert units[('compute_dtype=bfloat16', 2)] == pytest.approx(74.2)  # replicates averaged
  excluded = dict(zip(out.excluded['run'], out.excluded['reason'], strict=True))
  assert excluded == {
    f'{tmp_path}/f32/s8': 'running: step 3/10',
    f'{tmp_path}/f32/s9': 'failed: loss is NaN',
  }
  arms = out.arms.set_index('arm')
  assert arms['deterministic'].tolist() == [False, True]
  assert 'different value' in arms['determinism'].iloc[0]
  assert arms['within_sd'].tolist() == pytest.approx([8.4 / np.sqrt(2), 0.0])
  pair = out.pairs.iloc[0]
  assert pair['paired'] and pair['n_pairs'] == 4  # bf16 is nondeterministic: paired all the same
  assert pair['design'] == (
    'paired: 4 shared seeds, same init and data order; '
    '1 unshared seed(s) left out of the paired tests'
  )


def test_report_opens_with_the_answer_then_setup_and_why(tmp_path, capsys):
  make_runs(tmp_path / 'runs')
  analyse.main([f'--runs={tmp_path}/runs', '--margin=1', '--margin-reason=a planted reason'])
  text = capsys.readouterr().out
  answer = text.split('## Answer')[1].split('## Setup')[0]
  assert '**Question.** Which numerical setting changes test accuracy on gpu' in answer
  assert '| compute_dtype=bfloat16 − compute_dtype=float32 | -2.90 |' in answer  # A − B, pp
  setup = text.split('## Setup')[1].split('## Why each verdict')[0]
  # data.task: a field the record predates counts as its default (runrecord/record.py row)
  assert (
    '- dataset: digits, task identity; train 1437 / test 360 images; one test image = 0.278 pp'
    in setup
  )
  assert '- training: 2 epochs, model resnet18 width 0.25, resolution 8 px' in setup
  assert 'compute_dtype=bfloat16 (4 seeds, 5 runs)' in setup
  assert 'equivalence margin: ±1 pp (from --margin: a planted reason)' in setup
  verdict = text.split('## Why each verdict')[1].split('## Arms')[0]
  assert (
    verdict.count('- **') == 1 and '**compute_dtype=bfloat16 vs compute_dtype=float32: ' in verdict
  )
  assert 'Power (estimated from n = 4 pairs; sd of the per-seed differences' in verdict
  assert (
    text.index('## Answer') < text.index('## Setup') < text.index('## Why') < text.index('## Arms')
  )


def test_cli_formats_and_small_arm(tmp_path, capsys):
  make_runs(tmp_path / 'runs')
  record.write_results(f'{tmp_path}/runs/tpu/s0', fake_results(0, 0.8, platform='tpu'))
  analyse.main([f'--runs={tmp_path}/runs', '--margin=1'])
  captured = capsys.readouterr()
  assert "arm 'tpu, compute_dtype=float32' has n < 2" in captured.err
  assert '| gpu, compute_dtype=bfloat16 | gpu, compute_dtype=float32 |' in captured.out
  assert 'tpu' not in captured.out.split('## Comparisons: every test')[1].split('## Design')[0]
  assert 'failed: loss is NaN' in captured.out
  analyse.main([f'--runs={tmp_path}/runs', '--format=latex'])
  tex = capsys.readouterr().out
  assert tex.startswith('\\begin{table}') and '\\toprule' in tex and 'bfloat16' in tex
  assert '**' not in tex and '\\item' not in tex and tex.count('\\begin{tabular}') == 3
  analyse.main([f'--runs={tmp_path}/runs', '--format=csv'])
  tables = csv_tables(capsys.readouterr().out)
  assert list(tables['arms']['n']) == [4, 5, 1] and len(tables['pairs']) == 1
  assert len(tables['excluded']) == 2 and len(tables['replicates']) == 2


def test_one_line_errors(tmp_path, capsys):
  with pytest.raises(ValueError, match='--runs: no run'):
    inputs.load_runs(str(tmp_path))
  with pytest.raises(ValueError, match='--runs: .* does not exist'):
    inputs.load_runs(str(tmp_path / 'nope'))
  with pytest.raises(ValueError, match="--metric: no column 'final.top5'"):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), metric='final.top5')
  with pytest.raises(ValueError, match="--seed-col: no column 'rep'"):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), seed_col='rep')
  with pytest.raises(ValueError, match='--margin'):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), margin=0)
  with pytest.raises(SystemExit) as e:
    analyse.main([f'--runs={tmp_path}'])
  message = capsys.readouterr().err
  assert (
    e.value.code == 2 and message.startswith('error: --runs: no run') and message.count('\n') == 1
  )
  failed = frame({'a': [0.1, 0.2]}).assign(status='failed')
  with pytest.raises(ValueError, match='none of the 2 runs is completed'):
    stats.arms_and_pairs(failed)


def test_root_of_only_failed_runs_lists_them_with_reasons(tmp_path, capsys):
  for seed, status, step in ((0, 'failed', 10), (1, 'running', 3)):
    results_ = fake_results(seed, 0.1, status=status, step=step)
    del results_['final']  # stopped before any evaluation: no metric column at all
    record.write_results(f'{tmp_path}/a/s{seed}', results_, step=step)
  with pytest.raises(SystemExit) as e:
    analyse.main([f'--runs={tmp_path}'])
  message = capsys.readouterr().err.rstrip('\n')
  assert (
    e.value.code == 2
    and message.startswith('error: --runs/--csv: none of the 2 runs is completed')
    and '\n' not in message
  )
  assert f'{tmp_path}/a/s0 (failed: loss is NaN)' in message
  assert f'{tmp_path}/a/s1 (running: step 3/10)' in message and '--metric' not in message


def test_non_finite_metric_in_csv_is_excluded_and_listed(tmp_path):
  values = [0.70, 0.71, float('inf'), 0.72, 0.69, 0.70, float('-inf'), 0.71]
  table = pd.DataFrame({'platform': ['tpu'] * 4 + ['gpu'] * 4, 'accuracy': values})
  table.to_csv(tmp_path / 'r.csv', index=False)
  assert 'inf' in (tmp_path / 'r.csv').read_text()
  out = stats.arms_and_pairs(
    inputs.read_csv(str(tmp_path / 'r.csv')), group_by=['platform'], metric='accuracy'
  )
  excluded = dict(zip(out.excluded['run'], out.excluded['reason'], strict=True))
  assert excluded == {
    f'{tmp_path}/r.csv:4': 'accuracy = inf is not finite',
    f'{tmp_path}/r.csv:8': 'accuracy = -inf is not finite',
  }
  arms = out.arms.set_index('arm')
  assert list(arms['n']) == [3, 3] and np.isfinite(arms['mean']).all()
  assert arms.loc['tpu', 'mean'] == pytest.approx(100 * np.mean([0.70, 0.71, 0.72]))
  assert out.scale == 100  # the excluded inf does not turn the percent scaling off
