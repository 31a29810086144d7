"""A fresh hostile pass (issue 36's own, beyond its 18 cases and the last round's list): each case
what a user brings, its outcome tested -- refused in one line where it would mislead, and shown to
be fine where it already is. Planted CSVs, declarations and run folders; no training."""

import errno
import fcntl
import json
import os

import pytest

from analysis import analyse, declaration, draw, export, inputs
from configs import common, digits, validation
from input_pipeline import batching
from runrecord import files, record, rules
from sweeps import sweep
from tests.support.commands import cli_error, write_config
from tests.support.planted_runs import plant
from tests.support.planted_saved_predictions import LABELS, N, item
from tests.support.planted_tables import DIGITS, runs_csv, table, write
from trainer import checkpoint

LOCK = '.tpu-gpu-parity.lock'  # runrecord/files.py's lock file in a destination


def test_a_study_json_with_a_byte_order_mark_reads(tmp_path):
  """Before: 'cannot read ... as a study declaration (Unexpected UTF-8 BOM)'; Windows editors
  write one."""
  path = tmp_path / 'study.json'
  path.write_bytes(b'\xef\xbb\xbf' + json.dumps(DIGITS).encode())
  assert declaration.load(str(path)) == DIGITS


def test_a_key_given_twice_is_refused_not_the_last_kept(tmp_path):
  """Before: {"margin": 2, "margin": 0.5} silently declared 0.5."""
  path = tmp_path / 'study.json'
  path.write_text('{"margin": 2.0, "margin": 0.5}')
  with pytest.raises(ValueError, match="the key 'margin' is given twice; give it once"):
    declaration.load(str(path))


@pytest.mark.parametrize(
  'key, value, says',
  [
    ('compare', [['tpu', 'gpu'], ['gpu', 'tpu']], 'is given twice (in either order)'),
    ('labels', {'profle': '{}'}, "labels: 'profle' is not one of the declared factors"),
    ('seeds', [0, -1], '-1 is not a seed'),
    ('seeds', [0, 2**32], '4294967296 is not a seed'),
    ('margin', float('nan'), 'margin: nan is not a usable margin'),
  ],
)
def test_more_declaration_values_are_refused(key, value, says):
  assert any(says in line for line in declaration.problems({**DIGITS, key: value}))


def test_a_count_written_as_a_float_is_a_count():
  """Fine as is: seeds 1e3 (JSON 1000.0) is 1000 seeds, as 6.0 is 6."""
  assert declaration.problems({'seeds': 1e3}) == []
  assert declaration.declared_seeds({'seeds': 6.0}) == list(range(6))


# The CSV's columns.


def test_numeric_platform_names_read_as_text(tmp_path):
  """Fine as is: platforms written as numbers (1, 2) are two platforms named '1' and '2'."""
  frame = table(platforms=(1, 2))
  out = analyse.study_analysis(
    inputs.read_csv(write(frame, tmp_path)), group_by=['platform', 'compute_dtype']
  )
  assert sorted(out.runs['platform'].astype(str).unique()) == ['1', '2']


def test_an_empty_run_id_column_identifies_runs_by_their_run(tmp_path):
  """Fine as is: an export of records without ids, or a hand-made CSV with the column empty."""
  frame = table().assign(run_id=None)
  assert len(inputs.read_csv(write(frame, tmp_path))) == 24


@pytest.mark.parametrize('scale', ['0', '-100', 'nan', 'inf', 'abc'])
def test_a_scale_that_is_no_factor_is_refused(tmp_path, capsys, scale):
  """Before: --scale 0 made every accuracy 0 ('identical arithmetic' everywhere), -100 flipped
  every difference's sign."""
  lines = cli_error(capsys, analyse.main, ['--csv', runs_csv(tmp_path / 'a.csv'), '--scale', scale])
  assert len(lines) == 1 and lines[0].startswith('error: argument --scale: ')


# Predictions and run folders.


def test_predictions_of_another_test_split_than_the_records_are_left_out():
  """Before: compared example by example with runs of the record's split (or, when another run
  had the record's fingerprint, the whole analysis stopped at the agreement section)."""
  assert inputs.item_problem(item(LABELS), N, 'ab12cd34ef56ab78') is None
  assert inputs.item_problem(item(LABELS), N, 'ffff') == (
    'the predictions of test split ab12cd34ef56ab78, the results of ffff'
  )


def test_an_old_records_platform_identity_is_not_held_against_a_resume():
  """Fine: a record written before CPU facts existed (identity 'cpu': not recorded) resumes on
  any CPU without the identity refusal (its layout is still checked)."""
  old = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 8, 'num_processes': 1}
  now = {**old, 'cpu_model': 'x', 'cpu_isa': 'AVX2', 'xla_cpu_isa': 'SSE4_2'}
  assert rules.identity_differences(old, now) == []
  assert rules.identity_differences({**now, 'xla_cpu_isa': 'AVX2'}, now) == [
    'platform identity: cpu-AVX2 -> cpu-AVX2-max-SSE4_2'
  ]


def test_a_run_on_two_device_kinds_is_a_kind_of_its_own():
  """Before: a run continued (--allow_layout_change) from one device kind onto another was
  labelled, all of it, with the last kind: an arm of one kind held steps of another."""
  segments = [
    {'start_step': 0, 'stop_step': 4, 'platform': 'tpu', 'device_kind': 'TPU v4'},
    {'start_step': 4, 'stop_step': 8, 'platform': 'tpu', 'device_kind': 'TPU v5e'},
  ]
  row = rules.row(
    'r', {'status': 'completed', 'platform': 'tpu', 'device_kind': 'TPU v5e', 'segments': segments}
  )
  assert row['device_kind'] == 'TPU v4+TPU v5e' and row['platform'] == 'tpu'


# Writing.


def test_an_out_reached_through_a_symlink_is_the_same_out(tmp_path, capsys):
  """Fine: the lock file is reached through the link, so a second name for a held --out is
  refused as the first is."""
  real = tmp_path / 'out'
  real.mkdir()
  os.symlink(real, tmp_path / 'link')
  with files.Destination(real, command='analysis.analyse'):
    lines = cli_error(
      capsys, analyse.main, ['--csv', runs_csv(tmp_path / 'a.csv'), '--out', str(tmp_path / 'link')]
    )
  assert 'another command is writing it' in lines[0]


def test_what_a_killed_analysis_left_is_cleared_by_the_next(tmp_path, capsys):
  """A kill -9 mid-write leaves a staging folder and a lock file naming a dead pid: the kernel
  dropped the lock, so the next analysis takes it and removes the staging folder."""
  out = tmp_path / 'out'
  (out / f'{files.STAGING}999999-deadbeef').mkdir(parents=True)
  (out / f'{files.STAGING}999999-deadbeef' / 'report.md').write_text('half')
  (out / LOCK).write_text('{"pid": 999999, "host": "gone"}')
  analyse.main(['--csv', runs_csv(tmp_path / 'a.csv'), '--out', str(out)])
  capsys.readouterr()
  left = os.listdir(out)
  assert not any(n.startswith(files.STAGING) for n in left) and LOCK not in left
  assert 'report.md' in left


def test_export_refuses_a_folder_and_a_bad_declaration_in_one_line(tmp_path, capsys):
  """Before: --out an existing folder named runs.csv was an IsADirectoryError traceback, and a
  get_study() key nobody reads was copied beside the CSV."""
  root = plant(tmp_path / 'root')
  (tmp_path / 'x.csv').mkdir()
  lines = cli_error(capsys, export.main, ['--runs', root, '--out', str(tmp_path / 'x.csv')])
  assert lines == [f'error: --out={tmp_path / "x.csv"}: give a .csv file name']
  study = tmp_path / 'study.json'
  study.write_text('{"margn": 1.0}')
  lines = cli_error(
    capsys, export.main, ['--runs', root, '--out', str(tmp_path / 'r.csv'), '--study', str(study)]
  )
  assert lines == [f"error: {study}: 'margn' is not a declaration key; did you mean 'margin'?"]
  assert sorted(os.listdir(tmp_path)) == ['root', 'study.json', 'x.csv']


def test_draw_refuses_an_out_that_is_a_file_in_one_line(tmp_path, capsys):
  """Before: a FileExistsError traceback once the analysis had run."""
  root = plant(tmp_path / 'root')
  (tmp_path / 'figs').write_text('x')
  lines = cli_error(capsys, draw.main, ['--runs', root, '--out', str(tmp_path / 'figs')])
  assert len(lines) == 1 and 'is a file; give a folder (it is made when missing)' in lines[0]


# Training and the sweep.


@pytest.mark.parametrize('value', [-1, True])
def test_replicate_is_a_whole_number_from_zero(value):
  """Before: replicate -1 or True trained and was recorded as given."""
  config = digits.get_config('smoke')
  with pytest.raises(validation.ConfigError, match=r'config.replicate must be an integer >= 0'):
    config.replicate = value
    validation.resolve(config)


def test_the_configs_own_xla_flags_count_the_devices_a_sweep_run_sees(tmp_path):
  """A config whose numerics.xla_flags sets the device count: its runs see that many, and the
  sweep checks the batch against them."""
  cfg = write_config(
    tmp_path, "[{'seed': 0, 'numerics.xla_flags': '--xla_force_host_platform_device_count=3'}]"
  )
  (run,), _, _ = sweep.expand(f'{cfg}:smoke', str(tmp_path / 'root'))
  errors, _ = sweep.device_problems(
    [run], {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  )
  assert errors and 'is not divisible by the 3 devices' in errors[0]


def test_an_explicit_none_seed_part_is_the_seed():
  """Fine: --config.init_seed=None is config.seed, as unset is."""
  config = validation.resolve(
    common.apply_overrides(digits.get_config('smoke'), [('seed', 5), ('init_seed', None)])
  )
  assert common.init_seed_of(config) == 5


def test_a_test_set_smaller_than_the_devices_is_one_batch_of_one_per_device():
  """Fine: 7 test images on 8 devices: one batch of 8, one padded image, masked out."""
  assert batching.eval_batch_size(7, 512, 8) == 8


def test_a_completed_run_is_not_refused_on_another_identity(tmp_path):
  """Fine: the identity check reads only unfinished runs; a completed one trains nothing more
  (the sweep skips it; train.py says it is done)."""

  config = validation.resolve(digits.get_config('smoke'))
  saved = {
    'status': 'completed',
    'platform': 'cpu',
    'cpu_isa': 'AVX2',
    'xla_cpu_isa': 'AVX2',
    'config': config.to_dict(),
  }
  facts = {
    'platform': 'cpu',
    'device_kind': 'cpu',
    'num_devices': 8,
    'num_processes': 1,
    'cpu_model': 'x',
    'cpu_isa': 'AVX2',
    'xla_cpu_isa': 'AVX',
  }

  class Manager:  # what check_workdir_run reads of an Orbax manager
    def all_steps(self):
      return [10]

    def restore(self, step, args=None):
      return {record.RESULTS_ITEM: saved}

  assert (
    checkpoint.check_workdir_run(Manager(), str(tmp_path), config, False, None, facts) is not None
  )


def test_a_file_system_without_locks_still_gets_its_report(tmp_path, capsys, monkeypatch):
  """Some NFS mounts refuse flock (ENOLCK): the report is still staged and moved into place, with
  a note, rather than refused."""

  def no_locks(fd, how):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(fcntl, 'flock', no_locks)
  analyse.main(['--csv', runs_csv(tmp_path / 'a.csv'), '--out', str(tmp_path / 'out')])
  assert 'cannot lock here (No locks available); written unlocked' in capsys.readouterr().err
  assert (tmp_path / 'out' / 'report.md').exists() and LOCK not in os.listdir(tmp_path / 'out')
