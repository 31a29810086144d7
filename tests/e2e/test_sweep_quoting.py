"""sweeps.sweep's command list and SLURM script under hostile input: a root, a config file name and
override values that are shell code run nothing; what cannot be made safe is refused in one line."""

import os
import shlex
import subprocess

from sweeps import runner, sweep
from tests.support.commands import write_config

# Shell code in every form a shell would run it in: each one touches $MARK when executed.
EVIL = ('$(touch "$MARK")', '`touch "$MARK"`', '"; touch "$MARK"; "', '\'; touch "$MARK"; \'')
VALUES = [f'{code} v{i}' for i, code in enumerate(EVIL)]  # distinct arms: distinct folders


def recording_python(tmp_path):
  """A `python` that writes its working folder, the cache variable and its argv, NUL-separated."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  recorder = bin_dir / 'python'
  recorder.write_text(
    '#!/bin/bash\nprintf \'%s\\0\' "$PWD" "$JAX_COMPILATION_CACHE_DIR" "$@" > "$ARGV"\n'
  )
  recorder.chmod(0o755)
  return bin_dir


def run_task(script, task, tmp_path, bin_dir):
  """Run the SLURM script's task `task` as SLURM would (bash, SLURM_ARRAY_TASK_ID); (argv, rc)."""
  env = {
    **os.environ,
    'SWEEP_PYTHON': str(bin_dir / 'python'),
    'SLURM_ARRAY_TASK_ID': str(task),
    'MARK': str(tmp_path / 'EXECUTED'),
    'ARGV': str(tmp_path / 'argv'),
  }
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  proc = subprocess.run(['bash', str(script)], env=env, capture_output=True, text=True)
  argv = (tmp_path / 'argv').read_text().split('\0')[:-1] if (tmp_path / 'argv').exists() else []
  return argv, proc


def test_hostile_root_config_name_and_values_run_nothing(tmp_path, capsys):
  folder = tmp_path / f'cfg {EVIL[0]} {EVIL[1]}'
  folder.mkdir()
  cfg = write_config(
    folder,
    '['
    + ', '.join(f"{{'seed': {i}, 'data.manual_dir': {value!r}}}" for i, value in enumerate(VALUES))
    + ']',
    name=f'c{EVIL[0]};x.py',
  )
  root = str(tmp_path / f'root {EVIL[0]} {EVIL[1]} {EVIL[3]}')
  out = tmp_path / 'out'
  code = sweep.main(
    [
      f'--config={cfg}:smoke',
      f'--root={root}',
      '--dry-run',
      f'--emit-commands={out}/c.txt',
      f'--emit-slurm={out}/s.sbatch',
    ]
  )
  assert code == 0, capsys.readouterr().err
  script = out / 's.sbatch'
  assert subprocess.run(['bash', '-n', str(script)]).returncode == 0
  text = script.read_text()
  assert '#SBATCH --job-name=sweep-c-touch-MARK-x\n' in text
  assert f'#SBATCH --output={out}/slurm-%A_%a.out\n' in text
  runs, path, arg = sweep.expand(f'{cfg}:smoke', root)
  bin_dir = recording_python(tmp_path)
  for task, run in enumerate(runs):
    argv, proc = run_task(script, task, tmp_path, bin_dir)
    assert proc.returncode == 0, proc.stderr
    assert argv == [runner.REPO, f'{root}/.jax_cache'] + runner.command(run, path, arg)[1:]
    assert f'--config.data.manual_dir={VALUES[task]}' in argv
  assert not (tmp_path / 'EXECUTED').exists()
  lines = (out / 'c.txt').read_text().splitlines()
  assert [shlex.split(line)[1:] for line in lines] == [
    runner.command(r, path, arg)[1:] for r in runs
  ]


def test_unsafe_sbatch_folder_and_line_breaks_are_refused_before_writing(tmp_path, capsys):
  root = tmp_path / 'my runs'
  assert sweep.main(['--config=configs/digits.py:smoke', f'--root={root}', '--dry-run']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'error: --emit-commands={root}/sweep_commands.txt: ')
  assert '#SBATCH --output=' in err[0] and "holds ' '" in err[0]
  assert not root.exists()
  cfg = write_config(tmp_path, "[{'seed': 0, 'data.manual_dir': 'x\\ntouch \"$MARK\" #'}]")
  assert sweep.main([f'--config={cfg}:smoke', f'--root={tmp_path}/r', '--dry-run']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: get_sweep() run 0: data.manual_dir: ')
  assert 'line break' in err[0] and not (tmp_path / 'r').exists()


def test_bucket_root_writes_nothing_here_without_emit_paths(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  argv = ['--config=configs/digits.py:smoke', '--root=gs://bucket/study', '--dry-run']
  assert sweep.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
    'error: --root=gs://bucket/study: the command list and the SLURM script are '
    'written on this machine, not into a bucket: give --emit-commands=FILE and '
    '--emit-slurm=FILE (local paths)'
  ]
  assert os.listdir(tmp_path) == []
  assert sweep.main(argv + ['--emit-commands=c.txt', '--emit-slurm=s.sbatch']) == 0
  # a dry run writes what --emit-* name and nothing else: no study.json in the working directory
  assert sorted(os.listdir(tmp_path)) == ['c.txt', 's.sbatch']
  out = capsys.readouterr().out
  assert f'commands: {tmp_path}/c.txt' in out
  assert (
    'study declaration: not written (a dry run writes only what --emit-* name; '
    '--emit-study=FILE writes it, to copy to gs://bucket/study/study.json' in out
  )
  assert (
    sweep.main(argv + ['--emit-commands=c.txt', '--emit-slurm=s.sbatch', '--emit-study=decl.json'])
    == 0
  )
  assert sorted(os.listdir(tmp_path)) == ['c.txt', 'decl.json', 's.sbatch']
  assert (
    f'study declaration: {tmp_path}/decl.json (copy it to gs://bucket/study/study.json '
    'before the runs start)' in capsys.readouterr().out
  )


def test_a_dry_run_writes_nothing_and_summarises_a_long_listing_first(
  tmp_path, monkeypatch, capsys
):
  """The study's 48 runs, dry: no root, no command list, no study.json anywhere (it wrote the root's
  files, and beside a bucket's command list a study.json); the summary line comes first, then 10
  commands and a count of the rest (it printed 48 'would run' lines above the summary)."""
  monkeypatch.chdir(tmp_path)
  root = tmp_path / 'root'
  assert sweep.main(['--config=configs/digits.py:study', f'--root={root}', '--dry-run']) == 0
  assert os.listdir(tmp_path) == []
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0] == f'48 runs (8 arms) under {root}: 0 completed (skipped), 48 to run'
  assert lines[1].startswith('study declaration: not written (a dry run writes only what --emit-*')
  assert [line for line in lines if line.startswith('would run: ')] == lines[2:12]
  assert lines[12:] == ['... and 38 more (--emit-commands=FILE writes all)']
