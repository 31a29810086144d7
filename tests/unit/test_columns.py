"""Every column the analysis reads, validated (issue 36): platform names normalised or refused,
losses finite and >= 0, one test set per data config (and no pair across two), the loss table on
the metric's own scale, a run id met twice counted once. Planted CSVs, no training."""

import pandas as pd
import pytest

from analysis import analyse, inputs, stats
from runrecord import record
from tests.support.commands import cli_error
from tests.support.planted_tables import table, write

METRIC = record.DEFAULT_METRIC


def test_platform_spellings_are_one_platform(tmp_path, capsys):
  """Case 6. Before: 'GPU' and 'gpu ' beside 'gpu' gave four platforms, the question became
  'gpu␠ vs GPU' and an arm shrank to 2 seeds, exit 0."""
  frame = table()
  gpu = frame.index[frame['platform'] == 'gpu']
  frame.loc[gpu[:2], 'platform'] = 'GPU'
  frame.loc[gpu[2:4], 'platform'] = 'gpu '
  frame = frame.astype({'platform': object})
  frame.loc[frame.index[0], 'platform'] = ' CPU-AVX2'  # the ISA keeps its case; JAX's part not
  frame.loc[frame.index[frame['platform'] == 'cpu'], 'platform'] = 'cpu-AVX2'
  out = analyse.study_analysis(
    inputs.read_csv(write(frame, tmp_path)), group_by=['platform', 'compute_dtype']
  )
  assert sorted(out.runs['platform'].unique()) == ['cpu-AVX2', 'gpu']
  assert list(out.arms['n']) == [6, 6, 6, 6]
  err = capsys.readouterr().err
  assert "platform 'GPU' read as 'gpu'" in err and "platform 'gpu ' read as 'gpu'" in err


def test_an_empty_platform_cell_is_refused_naming_its_line(tmp_path, capsys):
  """Case 15. Before: a TypeError traceback."""
  frame = table().astype({'platform': object})
  frame.loc[3, 'platform'] = None
  frame.loc[7, 'platform'] = '  '
  path = write(frame, tmp_path)
  lines = cli_error(capsys, analyse.main, ['--csv', path])
  assert lines[:2] == [
    f'error: --csv {path}: platform, line 5: the platform is empty; write the '
    'platform the run ran on (e.g. gpu), or leave the run out',
    f'error: --csv {path}: platform, line 9: the platform is empty; write the '
    'platform the run ran on (e.g. gpu), or leave the run out',
  ]


def test_names_that_differ_only_in_case_are_refused(tmp_path, capsys):
  frame = table(platforms=('cpu-AVX2', 'cpu-avx2'))
  lines = cli_error(capsys, analyse.main, ['--csv', write(frame, tmp_path)])
  assert "platform: 'cpu-AVX2' on line 2; 'cpu-avx2' on line 14 differ only in case" in lines[0]


def test_another_test_split_on_one_platform_is_refused(tmp_path, capsys):
  """Case 7. Before: the gpu rows, tested on another split, were paired with the cpu rows as if
  the test sets were the same (PAIRING_FIELDS named data.fingerprint, which no dataset records)."""
  frame = table()
  frame.loc[frame['platform'] == 'gpu', 'data.split_fingerprint'] = 'beef'
  path = write(frame, tmp_path)
  lines = cli_error(capsys, analyse.main, ['--csv', path])
  assert lines[0].startswith(
    f'error: --csv {path}: data.split_fingerprint: runs of one data '
    "config were tested on different test sets ('f00d' (12 runs, e.g. "
    "cpu/float32/s0), 'beef' (12 runs, e.g. gpu/float32/s0))"
  )


def test_runs_of_two_datasets_are_refused_not_compared_as_platforms(tmp_path, capsys):
  """Issue 42, item 9. Before: digits runs on cpu and CelebA runs on gpu read as the platform gap
  ('cpu − gpu −0.30'), exit 0."""
  frame = table().assign(**{'config.data.name': 'digits'})
  gpu = frame['platform'] == 'gpu'
  frame.loc[gpu, 'config.data.name'], frame.loc[gpu, 'data.split_fingerprint'] = 'celeba', 'beef'
  out = tmp_path / 'out'
  lines = cli_error(capsys, analyse.main, ['--csv', write(frame, tmp_path), '--out', str(out)])
  assert lines[0] == (
    f'error: --csv {tmp_path}/runs.csv: config.data.name: runs of several datasets (celeba (12 '
    'runs), digits (12 runs)); analyse each dataset apart'
  )
  assert not out.exists()


def test_a_test_size_varying_inside_an_arm_is_refused(tmp_path, capsys):
  frame = table()
  frame.loc[2, 'data.test_size'] = 359
  lines = cli_error(capsys, analyse.main, ['--csv', write(frame, tmp_path)])
  assert 'data.test_size: runs of one data config were tested on different test sets' in lines[0]


def test_arms_of_another_split_seed_do_not_pair():
  """A declared data factor (another split seed: another test split) is allowed, and its arms are
  compared unpaired: the pairing fields hold the test set."""
  frame = table(platforms=('cpu',))
  other = frame['numerics.requested.compute_dtype'] == 'bfloat16'
  frame.loc[other, 'config.data.split_seed'] = 7
  frame.loc[other, 'data.split_fingerprint'] = 'beef'
  assert inputs.test_set_problems(frame) == []
  out = stats.arms_and_pairs(frame, margin=0.5)
  assert (
    out.pairs['design']
    .iloc[0]
    .startswith('unpaired: pairing fields differ: config.data.split_seed, data.split_fingerprint')
  )
  assert set(record.TEST_SET) <= set(record.PAIRING_FIELDS)
  assert 'data.fingerprint' not in record.PAIRING_FIELDS


def test_the_loss_table_shows_a_percent_csv_in_percent(tmp_path):
  """Case 8. Before: a percent-scale CSV's report_train_loss.csv read 9559 %."""
  for percent in (False, True):
    out = analyse.study_analysis(inputs.read_csv(write(table(percent=percent), tmp_path)))
    accuracy = out.agreement.train_loss['test_accuracy_pct']
    assert accuracy.between(94, 97).all(), accuracy


@pytest.mark.parametrize(
  'bad, says',
  [
    (-5, '-5 is negative, and a loss is >= 0'),
    (float('inf'), 'inf is not finite'),
    ('x', "'x' is not a number"),
  ],
)
def test_a_bad_train_loss_is_refused(tmp_path, capsys, bad, says):
  """Case 11. Before: final.train_loss -5 or inf entered the loss table (only the metric column
  was checked)."""
  frame = table().astype({'final.train_loss': object})
  frame.loc[4, 'final.train_loss'] = bad
  path = write(frame, tmp_path)
  lines = cli_error(capsys, analyse.main, ['--csv', path])
  assert (
    lines[0].startswith(f'error: --csv {path}: final.train_loss, line 6: ') and says in lines[0]
  )


def test_a_real_percent_below_one_is_kept_with_scale_one(tmp_path, capsys):
  """Before: told to multiply by 100, with no way to keep a real 1.0 % run."""
  frame = table(percent=True)
  frame.loc[5, METRIC] = 1.0
  path = write(frame, tmp_path)
  lines = cli_error(capsys, analyse.main, ['--csv', path])
  assert (
    'line 7: 1 is at most 1 while 23 rows are in percent: a fraction? multiply it by 100; a '
    'real percent below 1? give --scale 1' in lines[0]
  )
  analyse.main(['--csv', path, '--scale', '1'])
  assert '## Answer' in capsys.readouterr().out
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--scale', '100'])
  assert 'x --scale 100 is above 100 %' in lines[0]


def test_copied_rows_of_an_export_without_run_ids_count_once_not_as_replicates(tmp_path, capsys):
  """Issue 42, item 7. Before: an export without a run_id column (written before ids), 3 of its
  rows copied under other `run` paths: the copies became replicates, 'identical: yes'."""
  frame = table().drop(columns=['run_id']).assign(wall_time_s=lambda f: 10.0 + f.index)
  again = frame.iloc[:3].assign(run=lambda f: 'copy/' + f['run'])
  out = analyse.study_analysis(inputs.read_csv(write(pd.concat([frame, again]), tmp_path)))
  assert len(out.runs) == 24 and out.replicates.empty
  assert 'lines 2, 26: one run met twice (the same values): counted once' in capsys.readouterr().err


def test_a_run_met_twice_in_a_csv_counts_once_and_two_records_of_one_id_are_refused(
  tmp_path, capsys
):
  """Two exports of one root (one through a bind mount: other `run` paths), concatenated."""
  frame = table()
  again = frame.iloc[:3].assign(run=lambda f: 'mnt/' + f['run'])
  path = write(pd.concat([frame, again]), tmp_path)
  out = analyse.study_analysis(inputs.read_csv(path))
  assert len(out.runs) == 24 and out.replicates.empty
  assert (
    'run id cpu-float32-0 on lines 2, 26: one run met twice (the same values): counted once'
    in capsys.readouterr().err
  )
  changed = again.assign(**{METRIC: again[METRIC] + 0.01})
  path = write(pd.concat([frame, changed]), tmp_path, 'conflict.csv')
  lines = cli_error(capsys, analyse.main, ['--csv', path])
  assert lines[0] == (
    f"error: --csv {path}: run_id: run id 'cpu-float32-0' holds different values "
    'on line 2 (cpu/float32/s0), line 26 (mnt/cpu/float32/s0): one run with two '
    'records (a copy taken at another step?); keep the one you mean'
  )


def test_surrounding_spaces_of_a_level_are_dropped(tmp_path):
  frame = table(platforms=('cpu',))
  frame.loc[0, 'numerics.requested.compute_dtype'] = 'float32 '
  out = stats.arms_and_pairs(inputs.read_csv(write(frame, tmp_path)), margin=0.5)
  assert len(out.arms) == 2
