"""sweeps.sweep checks every run's config, data and workdir before it launches or writes anything,
and reports all problems at once (one line each, exit code 2)."""

import os

import pytest

from configs import celeba
from input_pipeline import celeba as celeba_pipeline
from runrecord import record
from sweeps import runner, sweep


def write_config(tmp_path, base, sweep_body):
  path = tmp_path / 'cfg.py'
  path.write_text(
    f'from configs import {base}\nget_config = {base}.get_config\n\n'
    f'def get_sweep(arg=None):\n  return {sweep_body}\n'
  )
  return str(path)


def listing(folder):
  return (
    sorted(
      os.path.relpath(os.path.join(d, f), folder)
      for d, _, files in os.walk(folder)
      for f in files + ['']
    )
    if folder.exists()
    else []
  )


@pytest.mark.parametrize('dry_run', [True, False])
def test_bad_config_missing_data_and_uncreatable_root_all_reported_nothing_written(
  tmp_path, capsys, dry_run
):
  missing = tmp_path / 'no_celeba'
  cfg = write_config(
    tmp_path,
    'celeba',
    (
      "[{'numerics.profile': p, 'seed': s, **({'num_epochs': 0} if p == 'tpu_default' else {})} "
      "for p in ('tpu_default', 'f32') for s in (0, 1, 2, 3)]"
    ),
  )
  (tmp_path / 'blocker').write_text('a file where the root would go')
  before = listing(tmp_path)
  argv = [f'--config={cfg}:smoke,data.manual_dir={missing}', f'--root={tmp_path}/blocker/study']
  assert sweep.main(argv + (['--dry-run'] if dry_run else [])) == 2
  err = capsys.readouterr().err.splitlines()
  assert all(line.startswith('error: ') for line in err[:-1]) and len(err) == 4
  assert err[0] == (
    'error: config.num_epochs must be a positive integer, got 0 (runs: '
    'profile-tpu-default_num_epochs-0/seed0, profile-tpu-default_num_epochs-0/seed1, '
    'profile-tpu-default_num_epochs-0/seed2 and 1 more)'
  )
  assert f"config.data.manual_dir='{missing}' lacks {', '.join(celeba_pipeline.FILES)}" in err[1]
  assert err[2] == (
    f'error: --root={tmp_path}/blocker/study cannot be created: '
    f'{tmp_path}/blocker is a file, not a folder: choose another path'
  )
  assert err[3] == 'error: 3 problem(s) found before launching: nothing was run or written'
  assert listing(tmp_path) == before


def test_unwritable_run_folder_and_a_saved_run_with_other_settings(tmp_path, capsys, monkeypatch):
  root = tmp_path / 'r'
  runs, _, _ = sweep.expand('configs/digits.py:smoke', str(root))
  changed = runs[2].config.to_dict()
  changed['num_epochs'] = 99
  record.write_results(runs[2].workdir, {'status': 'completed', 'config': changed}, step=5)
  os.makedirs(runs[4].workdir)
  real_access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode: p != runs[4].workdir and real_access(p, mode))
  before = listing(root)
  assert sweep.main(['--config=configs/digits.py:smoke', f'--root={root}', '--dry-run']) == 2
  err = capsys.readouterr().err
  assert (
    f'error: {runs[2].workdir} holds a run with other settings (num_epochs: 99 -> 2): '
    'delete it or use another --root'
  ) in err
  assert f'error: --workdir={runs[4].workdir} is not writable: choose a folder' in err
  assert '2 problem(s) found' in err and listing(root) == before
  assert not (root / runner.COMMANDS_FILE).exists()


def test_celeba_data_checks_without_reading_images(tmp_path, monkeypatch):
  data = celeba.get_config('smoke').data
  assert 'config.data.manual_dir is empty' in celeba_pipeline.problems(data)[0]
  data.tfds_dir = str(tmp_path / 'tfds')
  assert 'holds no CelebA prepared by this project' in celeba_pipeline.problems(data)[0]
  data.manual_dir = str(tmp_path / 'files')
  os.makedirs(data.manual_dir)
  for name in celeba_pipeline.FILES[1:]:
    (tmp_path / 'files' / name).write_text('')
  assert f'lacks {celeba_pipeline.ZIP}' in celeba_pipeline.problems(data)[0]
  (tmp_path / 'files' / celeba_pipeline.ZIP).write_text('')
  assert celeba_pipeline.problems(data) == []
  monkeypatch.setattr(celeba_pipeline.importlib.util, 'find_spec', lambda name: None)
  assert celeba_pipeline.problems(data) == [
    f"config.data.manual_dir='{data.manual_dir}': preparing CelebA needs tensorflow-datasets, "
    'which is not installed: pip install -r requirements-celeba.txt'
  ]
  done = tmp_path / 'cache' / 'key'
  done.mkdir(parents=True)
  (done / 'done.json').write_text('{}')
  data.cache_dir = str(tmp_path / 'cache')
  assert celeba_pipeline.problems(data) == []  # a decoded cache needs no TensorFlow
  data.cache_dir = 'gs://bucket/cache'
  assert 'is a bucket path' in celeba_pipeline.problems(data)[0]


def test_bucket_roots_turn_data_problems_into_warnings(tmp_path, capsys):
  cfg = write_config(tmp_path, 'celeba', "[{'seed': 0}]")
  code = sweep.main(
    [
      f'--config={cfg}:smoke',
      '--root=gs://bucket/study',
      '--dry-run',
      f'--emit-commands={tmp_path}/c.txt',
      f'--emit-slurm={tmp_path}/s.sbatch',
    ]
  )
  captured = capsys.readouterr()
  assert code == 0 and (tmp_path / 'c.txt').exists()
  assert captured.err.startswith('warning: config.data.manual_dir is empty')
  assert captured.err.rstrip().endswith('(checked on this machine; the hosts need it)')
