"""The tools' writes to paths a user names (sweeps.sweep --emit-*, sweeps.preflight --out,
experiments.divergence --out, experiments.numerics_probe --out) go through runrecord/files.py: a
symlink stays a link and its target is written, a 600 file keeps its mode, a user's file beside
the outputs is left byte for byte, and a user's file in the way is refused before any compute.
(The divergence tool's and the preflight's written case: tests/e2e/test_divergence.py and
tests/tpu/test_tpu_preflight.py.)"""

import os
import subprocess
import sys

import pytest

from experiments import divergence, numerics_probe
from sweeps import sweep
from tests.conftest import ROOT
from tests.support.divergence_runs import SMOKE

NOTES = 'my own notes\n'


def state(*paths):
  """{path: (bytes or None, mode, link target or None)} of each path, without following a link."""
  out = {}
  for path in map(str, paths):
    link = os.readlink(path) if os.path.islink(path) else None
    body = open(path, 'rb').read() if os.path.isfile(path) else None
    out[path] = (body, os.lstat(path).st_mode, link)
  return out


def users_folder(tmp_path, *names):
  """A user's folder: notes.txt (mode 600) and `names` (their own files, mode 644), and a symlink
  `link` beside it pointing at it."""
  real = tmp_path / 'real'
  real.mkdir()
  for name, mode in (('notes.txt', 0o600), *((n, 0o644) for n in names)):
    (real / name).write_text(NOTES)
    os.chmod(real / name, mode)
  os.symlink(real, tmp_path / 'link')
  return real, tmp_path / 'link'


def test_sweep_writes_through_a_link_keeps_a_600_files_mode_and_leaves_the_rest(tmp_path, capsys):
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'theirs.txt').write_text('the target\n')
  os.symlink('theirs.txt', out / 'commands.txt')  # --emit-commands: a link to the user's file
  (out / 'job.sbatch').write_text('#!/bin/bash\n')
  os.chmod(out / 'job.sbatch', 0o600)
  (out / 'notes.txt').write_text(NOTES)
  os.chmod(out / 'notes.txt', 0o640)
  before = state(out / 'notes.txt')
  argv = ['--config=configs/digits.py:smoke', f'--root={tmp_path / "root"}', '--dry-run']
  argv += [f'--emit-commands={out}/commands.txt', f'--emit-slurm={out}/job.sbatch']
  argv += [f'--emit-study={out}/study.json']
  assert sweep.main(argv) == 0, capsys.readouterr().err
  assert os.readlink(out / 'commands.txt') == 'theirs.txt'
  assert (out / 'theirs.txt').read_text().startswith('python train.py --config=configs/digits.py')
  assert os.stat(out / 'job.sbatch').st_mode & 0o777 == 0o600
  assert (out / 'job.sbatch').read_text().startswith('#!/bin/bash\n#SBATCH')
  assert state(out / 'notes.txt') == before
  assert sorted(os.listdir(out)) == [
    'commands.txt',
    'job.sbatch',
    'notes.txt',
    'study.json',
    'theirs.txt',
  ]
  assert not (tmp_path / 'root').exists()


def test_sweep_refuses_a_folder_named_as_its_command_list_in_one_line(tmp_path, capsys):
  (tmp_path / 'c.txt').mkdir()
  argv = ['--config=configs/digits.py:smoke', f'--root={tmp_path / "root"}', '--dry-run']
  assert sweep.main(argv + [f'--emit-commands={tmp_path}/c.txt']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'error: --emit-commands {tmp_path}/c.txt is a folder; give a file name']
  assert os.listdir(tmp_path / 'c.txt') == []


def test_numerics_probe_writes_through_a_linked_folder_and_refuses_a_users_report(tmp_path, capsys):
  real, link = users_folder(tmp_path, 'numerics.md')
  before = state(*real.iterdir(), link)
  argv = ['--out', str(link), '--settings', 'default', '--model-settings', '', '--rows', '8']
  argv += ['--cols', '8', '--classes', '10', '--conv-spatial', '2', '--conv-batch', '1']
  assert numerics_probe.main(argv) == 2  # refused before anything is measured
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'error: --out {link}: holds files this project')
  assert 'numerics.md' in err[0] and state(*real.iterdir(), link) == before
  os.remove(real / 'numerics.md')
  before = state(real / 'notes.txt', link)
  assert numerics_probe.main(argv) == 0
  assert state(real / 'notes.txt', link) == before  # the link kept, the user's file untouched
  written = {p.name for p in real.iterdir()} - {'notes.txt'}
  assert set(numerics_probe.OUTPUTS) <= written
  assert numerics_probe.main(argv) == 0  # its own files: rewritten
  assert state(real / 'notes.txt', link) == before


def test_divergence_refuses_a_users_report_before_training(tmp_path, capsys):
  real, link = users_folder(tmp_path, 'divergence.md')
  before = state(*real.iterdir(), link)
  with pytest.raises(SystemExit) as stopped:
    divergence.main([f'--config={SMOKE}', '--a', 'profile=f32', '--out', str(link)])
  lines = capsys.readouterr().err.strip().splitlines()
  assert stopped.value.code == 2 and 'holds files this project did not write' in lines[-1]
  assert 'divergence.md' in lines[-1] and not any('building' in line for line in lines)
  assert state(*real.iterdir(), link) == before


def test_preflight_refuses_a_users_csv_before_compiling(tmp_path):
  """Without compiling, so without libtpu: the --out folder is checked first."""
  real, link = users_folder(tmp_path, 'preflight.csv')
  before = state(*real.iterdir(), link)
  argv = ['--config=configs/digits.py:smoke', '--topology', 'v5e:2x2', '--out', str(link)]
  proc = subprocess.run(
    [sys.executable, '-m', 'sweeps.preflight', *argv],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
    timeout=300,
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and 'preflight.csv' in lines[0], lines
  assert 'compiling' not in proc.stdout and state(*real.iterdir(), link) == before
