"""A run identity that travels with the run (issue 36, case 2): a run met twice by any path (a bind
mount, a copy, two roots, an export and its folders) is counted once; one id holding two different
records is one line naming both places; records written before ids existed are identified by their
content. Planted run folders (Orbax results, no training)."""

import os
import shutil
import sys
import uuid

import pandas as pd
import pytest

from analysis import analyse, export, inputs, stats
from runrecord import record, rules
from tests.support.commands import cli_error, in_mount_namespace
from tests.support.planted_runs import fake_results


def plant(root, seeds=(0, 1, 2), with_ids=True):
  """root/<dtype>/s<seed>: completed runs, each with its own run_id (or none: an old record)."""
  for dtype in ('float32', 'bfloat16'):
    for seed in seeds:
      results = fake_results(seed, 0.8 + 0.001 * seed + 0.01 * (dtype == 'bfloat16'), dtype=dtype)
      results['wall_time_s'] = 10.0 + seed + (dtype == 'bfloat16')  # runs differ, as real ones do
      if with_ids:
        results['run_id'] = uuid.uuid4().hex  # as record.new_run_id makes it
      record.write_results(f'{root}/{dtype}/s{seed}', results)
  return str(root)


def analysed(roots):
  return stats.arms_and_pairs(inputs.load_runs(roots), margin=0.5)


@pytest.mark.parametrize('with_ids', [True, False], ids=['run_id', 'old records'])
def test_a_copied_root_counts_each_run_once(tmp_path, capsys, with_ids):
  """Before: the copy's runs were replicates of the originals ('nondeterminism 0 %',
  'deterministic: yes' from runs that never ran twice)."""
  root = plant(tmp_path / 'runs', with_ids=with_ids)
  shutil.copytree(root, tmp_path / 'backup')
  out = analysed([root, str(tmp_path / 'backup')])
  assert list(out.arms['n_runs']) == [3, 3] and out.replicates.empty
  err = capsys.readouterr().err
  assert err.count(', the same record): counted once') == 6
  assert f'note: {tmp_path}/backup/bfloat16/s0 is the run at {root}/bfloat16/s0 (run id ' in err


def test_a_copied_run_whose_run_id_was_removed_counts_once(tmp_path, capsys):
  """Issue 42, item 7. Before: the copy, keyed by its content (no id), was a second run of the
  seed, a replicate 'identical: yes' of the original."""
  root = plant(tmp_path / 'runs')
  shutil.copytree(f'{root}/float32/s1', tmp_path / 'copy')
  results = record.read_results(str(tmp_path / 'copy'))
  shutil.rmtree(tmp_path / 'copy')
  record.write_results(str(tmp_path / 'copy'), {k: v for k, v in results.items() if k != 'run_id'})
  out = analysed([root, str(tmp_path / 'copy')])
  assert list(out.arms['n_runs']) == [3, 3] and out.replicates.empty
  assert (
    f'note: {tmp_path}/copy is the run at {root}/float32/s1 (run id ' in capsys.readouterr().err
  )


def test_two_distinct_old_runs_with_equal_results_stay_two(tmp_path):
  """Records without an id are identified by their whole content: two runs of one seed that
  happen to reach the same accuracy (a deterministic platform) still differ in wall time."""
  for name, wall in (('a', 1.0), ('b', 2.0)):
    record.write_results(f'{tmp_path}/{name}', {**fake_results(0, 0.8), 'wall_time_s': wall})
  frame = inputs.load_runs(str(tmp_path))
  assert len(frame) == 2 and frame['run_id'].str.startswith('content-').all()
  assert frame['run_id'].nunique() == 2


def test_one_id_with_two_records_is_one_line_naming_both_places(tmp_path, capsys):
  """A copy taken at step 10, the original then continued (another record, the same id)."""
  root = plant(tmp_path / 'runs')
  shutil.copytree(root, tmp_path / 'copy')
  later = record.read_results(f'{root}/float32/s1')
  record.write_results(f'{root}/float32/s1', {**later, 'step': 20, 'wall_time_s': 99.0}, step=20)
  lines = cli_error(capsys, analyse.main, ['--runs', root, str(tmp_path / 'copy')])
  assert len(lines) == 1 and lines[0].startswith(f'error: --runs: run {later["run_id"]} is at ')
  assert f'{root}/float32/s1' in lines[0] and f'{tmp_path}/copy/float32/s1' in lines[0]
  assert (
    'with different records (step 20, completed vs step 10, completed): one is a copy' in lines[0]
  )


def test_two_copies_resumed_to_the_same_step_are_not_said_taken_at_another_point(tmp_path, capsys):
  """Issue 42, item 14. Before: 'one is a copy of the other taken at another point' of two copies
  of a stopped run, both resumed to the same step (each with its own wall time)."""
  root = plant(tmp_path / 'runs')
  shutil.copytree(root, tmp_path / 'copy')
  for folder, wall in ((root, 50.0), (f'{tmp_path}/copy', 60.0)):
    stopped = record.read_results(f'{folder}/float32/s1')
    record.write_results(f'{folder}/float32/s1', {**stopped, 'wall_time_s': wall}, step=20)
  lines = cli_error(capsys, analyse.main, ['--runs', root, str(tmp_path / 'copy')])
  assert len(lines) == 1 and 'another point' not in lines[0]
  assert lines[0].endswith(
    '(both at step 10, completed, differing in wall_time_s): copies that went on separately; '
    'keep the one you mean'
  )


def test_the_export_carries_the_run_id_and_an_export_beside_its_folders_counts_once(
  tmp_path, capsys
):
  root = plant(tmp_path / 'runs')
  ids = set(inputs.load_runs(root)['run_id'])
  export.main(['--runs', root, '--out', str(tmp_path / 'a.csv')])
  shutil.copytree(root, tmp_path / 'copy')
  export.main(['--runs', str(tmp_path / 'copy'), '--out', str(tmp_path / 'b.csv')])
  a, b = pd.read_csv(tmp_path / 'a.csv'), pd.read_csv(tmp_path / 'b.csv')
  assert set(a['run_id']) == ids and set(b['run_id']) == ids and set(a['run']) != set(b['run'])
  pd.concat([a, b]).to_csv(tmp_path / 'both.csv', index=False)
  frame = inputs.read_csv(str(tmp_path / 'both.csv'))
  assert (
    len(frame) == 6
    and 'one run met twice (the same values): counted once' in capsys.readouterr().err
  )


def test_a_bind_mount_of_the_root_counts_each_run_once(tmp_path):
  """`mount --bind R R2; analyse --runs R R2` (case 2). Before: every run twice, invented
  replicates, 'nondeterminism 0 %', 'deterministic: yes'. Runs in a private mount namespace
  (unshare -rm), so nothing outside the test sees the mount."""
  root = plant(tmp_path / 'runs')
  os.makedirs(tmp_path / 'mnt')
  script = (
    f'mount --bind {root} {tmp_path}/mnt && exec {sys.executable} -m analysis.analyse '
    f'--runs {root} {tmp_path}/mnt --out {tmp_path}/out'
  )
  done = in_mount_namespace(script, 'a bind mount cannot be made')
  assert done.returncode == 0, done.stderr[-3000:]
  arms = pd.read_csv(tmp_path / 'out' / 'report_arms.csv')
  assert list(arms['n_runs']) == [3, 3] and 'nondeterminism' not in done.stdout.split('## Setup')[0]
  assert pd.read_csv(tmp_path / 'out' / 'report_replicates.csv').empty


def test_the_id_is_made_at_the_start_and_kept_by_a_resume():
  eight = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 8, 'num_processes': 1}
  fresh = {'run_id': record.new_run_id()}
  rules.start_segment(fresh, None, eight, 0)
  saved = dict(fresh)
  resumed = {'run_id': record.new_run_id()}  # what new_record makes in the resuming session
  rules.start_segment(resumed, saved, eight, 12)
  assert resumed['run_id'] == saved['run_id'] and len(saved['run_id']) == 32
  assert record.new_run_id() != record.new_run_id()
