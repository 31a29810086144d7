"""Inputs that must not fool the analysis (issue 29), the input side: a run counted once however it
is reached, a CSV checked before anything is computed. Planted run folders and CSVs, no training
(margins, errors, locale, labels: tests/integration/test_hostile_outputs.py)."""

import os
import signal

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, attribute, declaration, inputs, report, stats
from tests.conftest import ROOT
from tests.support.commands import cli_error
from tests.support.hostile_inputs import METRIC, accuracy_csv, fractions
from tests.support.planted_runs import plant


@pytest.fixture
def deadline():
  """Fail (instead of hanging) when a test runs past 60 s: a looping walk never returns."""

  def stop(*_):
    raise TimeoutError('the walk did not end')

  before = signal.signal(signal.SIGALRM, stop)
  signal.alarm(60)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, before)


# 1. A run is counted once, however it is reached.


def test_symlink_loops_inside_a_root_count_each_run_once_and_end(tmp_path, deadline):
  root = plant(tmp_path / 'root')
  os.symlink(root, f'{root}/float32/loop')  # back to the root
  os.symlink(f'{root}/bfloat16', f'{root}/bfloat16/s0/self')  # a second loop, inside a run's parent
  os.symlink(f'{root}/float32/s1', f'{root}/alias')  # a second name for one run
  runs = inputs.load_runs(root)
  assert len(runs) == 6 and runs['run'].is_unique
  assert f'{root}/float32/s1' in set(runs['run']) and f'{root}/alias' not in set(runs['run'])
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert list(out.arms['n_runs']) == [3, 3] and out.replicates.empty


@pytest.mark.parametrize('second', ['link', 'dotdot', 'slash'])
def test_a_root_given_twice_is_read_once(tmp_path, second):
  root = plant(tmp_path / 'root', seeds=(0, 1))
  os.symlink(root, tmp_path / 'link')
  again = {'link': str(tmp_path / 'link'), 'dotdot': f'{tmp_path}/x/../root', 'slash': f'{root}/'}[
    second
  ]
  os.makedirs(tmp_path / 'x', exist_ok=True)
  assert len(inputs.load_runs([root, again])) == 4
  assert (
    len(inputs.steps_frame(inputs.find_all([root, again]))) == 0
  )  # no metrics.jsonl, and no error


def test_a_run_under_two_roots_is_one_line_naming_both_places(tmp_path, capsys):
  root = plant(tmp_path / 'root', seeds=(0,))
  os.makedirs(tmp_path / 'other')
  os.symlink(f'{root}/float32', tmp_path / 'other' / 'f32')
  lines = cli_error(capsys, analyse.main, ['--runs', root, str(tmp_path / 'other')])
  assert (
    len(lines) == 1 and f'{root}/float32/s0' in lines[0] and f'{tmp_path}/other/f32/s0' in lines[0]
  )
  lines = cli_error(capsys, analyse.main, ['--runs', root, f'{root}/bfloat16'])
  assert (
    len(lines) == 1
    and f'is under both {root} (as {root}/bfloat16/s0) and {root}/bfloat16 ' in lines[0]
  )


@pytest.mark.parametrize(
  'bad, line',
  [
    (93.1, 'is in percent while 11 rows are fractions: divide it by 100'),
    (150.0, 'is above 100'),
    (1e308, 'is above 100'),
    (-0.5, 'is negative'),
    (float('inf'), 'is not finite'),
    ('abc', "'abc' is not a number"),
  ],
)
def test_bad_metric_values_are_refused_naming_column_line_and_fix(tmp_path, capsys, bad, line):
  values = fractions()
  values[5] = bad
  path = accuracy_csv(tmp_path / 'r.csv', values)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert lines[0].startswith(f'error: --csv {path}: accuracy, line 7: ') and line in lines[0], lines
  assert lines[-1].endswith('1 problem(s) above; nothing was analysed')
  lines = cli_error(
    capsys, attribute.main, ['--csv', path, '--metric', 'accuracy', '--factors', 'platform']
  )
  assert line in lines[0]


def test_a_minority_of_fractions_among_percents_is_refused_the_other_way(tmp_path):
  values = [80.0 + i for i in range(12)]
  values[3] = 0.81
  with pytest.raises(
    ValueError,
    match=r'line 5: 0.81 is at most 1 while 11 rows are in percent: a '
    r'fraction\? multiply it by 100; a real percent below 1\? give --scale 1',
  ):
    inputs.read_csv(accuracy_csv(tmp_path / 'r.csv', values), 'accuracy')


def test_a_negative_loss_is_refused_and_failed_runs_are_not_checked(tmp_path):
  path = tmp_path / 'l.csv'
  pd.DataFrame(
    {
      'platform': ['a', 'b', 'a', 'b'],
      'seed': [0, 0, 1, 1],
      'final.test_loss': [0.3, -0.1, 0.2, np.nan],
    }
  ).to_csv(path, index=False)
  with pytest.raises(
    ValueError, match=r'final.test_loss, line 3: -0.1 is negative, and a loss is >= 0'
  ):
    inputs.read_csv(str(path), 'test_loss')
  values = fractions()
  values[2] = 'nan-ish'  # a failed run's cell: not analysed, not checked
  status = ['completed'] * 12
  status[2] = 'failed'
  frame = inputs.read_csv(accuracy_csv(tmp_path / 'f.csv', values, status=status), 'accuracy')
  assert len(frame) == 12


def test_a_repeated_run_id_is_refused_not_averaged(tmp_path):
  runs = [f'r{i}' for i in range(12)]
  runs[7] = 'r3'
  with pytest.raises(ValueError, match=r"run, lines 5, 9: run id 'r3' appears 2 times"):
    inputs.read_csv(accuracy_csv(tmp_path / 'r.csv', fractions(), runs=runs), 'accuracy')


def test_an_empty_run_id_is_refused(tmp_path):
  runs = [f'r{i}' for i in range(12)]
  runs[1] = runs[3] = None
  with pytest.raises(ValueError, match=r'run, line 3: the run id is empty') as e:
    inputs.read_csv(accuracy_csv(tmp_path / 'r.csv', fractions(), runs=runs), 'accuracy')
  assert 'run, line 5: the run id is empty' in str(e.value)


@pytest.mark.parametrize(
  'bad, message',
  [('abc', "'abc' is not a whole-number seed"), (2.5, '2.5 is not a whole-number seed')],
)
def test_seeds_must_be_whole_numbers(tmp_path, capsys, bad, message):
  seeds = [i // 2 for i in range(12)]
  seeds[4] = bad
  path = accuracy_csv(tmp_path / 'r.csv', fractions(), seeds=seeds)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert lines[0].startswith(f'error: --csv {path}: seed, line 6: ') and message in lines[0]


def test_the_attribution_refuses_an_empty_seed_the_study_takes_it_as_a_run_of_its_own(
  tmp_path, capsys
):
  seeds = [i // 2 for i in range(12)]
  seeds[4] = None
  path = accuracy_csv(tmp_path / 'r.csv', fractions(), seeds=seeds)
  lines = cli_error(
    capsys, attribute.main, ['--csv', path, '--metric', 'accuracy', '--factors', 'platform']
  )
  assert lines[0] == (
    f"error: --csv {path}: seed, line 6: the seed is empty; write the run's "
    'integer seed (the attribution groups runs by seed)'
  )
  analyse.main(['--csv', path, '--metric', 'accuracy'])
  assert '## Answer' in capsys.readouterr().out


def test_every_problem_is_its_own_line_up_to_a_limit(tmp_path, capsys):
  values = fractions(40)
  for i in range(0, 30, 2):
    values[i] = 'x'
  path = accuracy_csv(tmp_path / 'r.csv', values)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert len(lines) == inputs.MAX_LINES + 2 and '... and 5 more' in lines[-2]
  assert lines[-1].endswith('15 problem(s) above; nothing was analysed')


def test_an_empty_metric_cell_is_excluded_and_counted_on_the_first_page(tmp_path, capsys):
  values = fractions()
  values[4] = None
  analyse.main(['--csv', accuracy_csv(tmp_path / 'r.csv', values), '--metric', 'accuracy'])
  page = capsys.readouterr().out.split('## Setup')[0]
  assert '**Excluded:** 1 of 12 runs (1 no value for accuracy)' in page


def test_the_digits_export_reads_back_unchanged_in_the_columns_it_keeps():
  path = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
  full = pd.read_csv(path)
  frame = inputs.read_csv(path, METRIC, 'seed', ['platform', 'profile'])
  dropped = set(full.columns) - set(frame.columns)
  assert dropped == {
    'final.test_loss',
    'final.train_accuracy',  # final.train_loss: the loss table
    'config.log_every_steps',
    'config.checkpoint_every_steps',
    'config.keep_checkpoints',
    'config.preset',
    'config.data.prefetch',
    'config.data.on_device',
    'config.data.manual_dir',
    'config.data.tfds_dir',
    'config.data.cache_dir',
    'config.distributed.coordinator_address',
    'config.distributed.initialize',
    'config.distributed.num_processes',
    'config.distributed.process_id',
  } & set(full.columns)
  assert isinstance(frame['versions.jax'].dtype, pd.CategoricalDtype)
  for column in frame.columns:
    assert frame[column].astype(str).tolist() == full[column].astype(str).tolist(), column
  # the same answer as from the table read whole
  declared = declaration.load(os.path.join(ROOT, 'results', 'digits_h100_cpu.study.json'))
  a = analyse.study_analysis(frame, declared)
  b = analyse.study_analysis(full, declared)
  assert report.render(a, 'md') == report.render(b, 'md')
