"""One run per TPU chip (`sweeps.sweep --tpu-chips`, sweeps/tpu.py): each child's libtpu
variables and port, recorded in its train.log; no chip ever held by two runs at once, whether the
sweep's runner hands the chips out or the emitted command list's launcher claims them. No TPU
needed: the children record their environment and the times they held it."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from sweeps import runner, sweep, tpu
from tests.conftest import ROOT

# A child that records its chip variables and when it held the chip, then exits.
RECORDER = (
  'import json, os, sys, time; start = time.time(); time.sleep(float(sys.argv[2])); '
  'names = ' + repr(tpu.VARIABLES) + '; '
  'print(json.dumps({"workdir": sys.argv[1], "start": start, "end": time.time(), '
  '**{n: os.environ.get(n) for n in names}}))'
)


def test_each_chip_gets_libtpus_variables_and_ports_of_its_own():
  envs = [tpu.environment(i) for i in range(8)]
  assert envs[3] == {
    'TPU_VISIBLE_CHIPS': '3',
    'TPU_PROCESS_BOUNDS': '1,1,1',
    'TPU_CHIPS_PER_PROCESS_BOUNDS': '1,1,1',
    'TPU_PROCESS_PORT': '8486',
    'TPU_PROCESS_ADDRESSES': 'localhost:8486',
    'TPU_RUNTIME_METRICS_PORTS': '8434',
    'CLOUD_TPU_TASK_ID': '0',
  }
  ports = [int(e[k]) for e in envs for k in ('TPU_PROCESS_PORT', 'TPU_RUNTIME_METRICS_PORTS')]
  assert len(set(ports)) == 16 and all(1024 < p < 65536 for p in ports)
  from jax._src.clusters import cloud_tpu_cluster  # jax.distributed's default coordinator port

  assert int(cloud_tpu_cluster.coordinator_port) not in ports
  assert all(e['TPU_PROCESS_ADDRESSES'] == f'localhost:{e["TPU_PROCESS_PORT"]}' for e in envs)


def test_child_env_of_a_chip_and_of_a_gpu():
  env = runner.child_env('/r', tpu.Chip(5))
  assert {k: env[k] for k in tpu.VARIABLES} == tpu.environment(5)
  gpu = runner.child_env('/r', 2)
  assert gpu['CUDA_VISIBLE_DEVICES'] == '2'


@pytest.mark.parametrize(
  'text, error',
  [
    ('0,0', 'once'),
    ('a,1', 'comma-separated'),
    ('-1', 'once'),
    ('', 'comma-separated'),
    (' , ', 'comma-separated'),
    ('60000', 'from 0 to 7 (8 chips'),
    ('8', 'from 0 to 7 (8 chips'),
  ],
)
def test_a_chip_list_that_would_share_or_miss_a_chip_is_refused(text, error):
  with pytest.raises(ValueError, match=re.escape(error)):
    tpu.parse_chips(text)


@pytest.mark.parametrize('accelerator, chips', [('v4-8', 4), ('v5p-8', 4), ('v5litepod-8', 8)])
def test_chip_ids_are_checked_against_the_hosts_chips(monkeypatch, accelerator, chips):
  """No TPU here: the host's chips come from the accelerator type a TPU VM sets."""
  monkeypatch.setenv('TPU_ACCELERATOR_TYPE', accelerator)
  assert len(tpu.parse_chips(','.join(map(str, range(chips))))) == chips
  with pytest.raises(ValueError, match=f'from 0 to {chips - 1} .{chips} chips: a v'):
    tpu.parse_chips(','.join(map(str, range(chips + 1))))


def records(runs):
  """{workdir: the child's record} from each run's train.log."""

  out = {}
  for run in runs:
    with open(os.path.join(run.workdir, 'train.log')) as f:
      lines = f.read().splitlines()
    out[run.workdir] = (lines, json.loads(next(line for line in lines if line.startswith('{'))))
  return out


def never_shared(held):
  """No two of [(chip, start, end)] on one chip overlap in time."""
  for i, (chip, start, end) in enumerate(held):
    for other, start2, end2 in held[i + 1 :]:
      assert chip != other or end <= start2 or end2 <= start, (chip, start, end, start2, end2)


def test_the_runner_gives_each_run_one_chip_never_two_runs_at_once(tmp_path, capsys):
  runs = [
    sweep.Run(
      {'a': i % 3}, f'a-{i % 3}', i // 3, {}, str(tmp_path / f'a-{i % 3}' / f'seed{i // 3}')
    )
    for i in range(6)
  ]
  chips = tpu.parse_chips('2,5')
  progress = runner.Progress(6, 0, 2)
  failures, in_use, _ = runner.run_all(
    runs,
    lambda r: [sys.executable, '-c', RECORDER, r.workdir, '0.4'],
    str(tmp_path),
    progress,
    2,
    chips,
    poll=0.05,
  )
  assert (failures, in_use, progress.done) == ([], [], 6)
  found = records(runs)
  held = []
  for lines, record in found.values():
    chip = record['TPU_VISIBLE_CHIPS']
    assert chip in ('2', '5') and record == {**record, **tpu.environment(int(chip))}
    header = next(line for line in lines if line.startswith('# '))  # the launch, in the run
    assert tpu.settings(tpu.environment(int(chip))) in header
    held.append((chip, record['start'], record['end']))
  assert {c for c, _, _ in held} == {'2', '5'}
  never_shared(held)
  assert 'on TPU chip 2' in capsys.readouterr().out


def test_the_command_lists_launcher_claims_a_free_chip(tmp_path):
  """Three commands of the list started at once on two chips: each on a chip no other holds at
  that time (the third waits for one), with that chip's variables."""
  env = {**os.environ, 'PYTHONPATH': ROOT, 'TMPDIR': str(tmp_path)}
  procs = []
  for i in range(3):
    argv = tpu.launcher(tpu.parse_chips('0,1')) + ['python', '-c', RECORDER, f'run{i}', '1.0']
    procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True))
    time.sleep(0.2)

  outs = [p.communicate(timeout=120)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0]
  held, ports = [], set()
  for out in outs[:2]:
    record = json.loads(out.strip().splitlines()[-1])
    ports |= {record['TPU_PROCESS_PORT'], record['TPU_RUNTIME_METRICS_PORTS']}
  assert len(ports) == 4  # the two processes on chips 0 and 1: distinct process, metrics ports
  for out in outs:
    record = json.loads(out.strip().splitlines()[-1])
    chip = record['TPU_VISIBLE_CHIPS']
    assert record == {**record, **tpu.environment(int(chip))}
    assert out.startswith(f'tpu_chips: TPU_VISIBLE_CHIPS={chip} ')
    held.append((chip, record['start'], record['end']))
  assert {c for c, _, _ in held[:2]} == {'0', '1'}
  never_shared(held)


@pytest.mark.parametrize(
  'chips, command, error',
  [
    ('', ['true'], "--chips='': give comma-separated chip ids"),
    (' , ', ['true'], "--chips=' , ': give comma-separated chip ids"),
    ('60000', ['true'], '--chips=60000: give each chip id once, from 0 to 7'),
    ('0', ['no-such-command-here'], 'no-such-command-here: no such command'),
    ('0', ['true'], 'tpu_chips: cannot hold the chip locks there'),
  ],
)
def test_the_launchers_bad_input_is_one_line_exit_2_at_once(tmp_path, chips, command, error):
  """Before: an empty list hung forever, 60000 gave port 68476, a file at $TMPDIR/tpu_chips and a
  missing command were tracebacks."""
  (tmp_path / 'tpu_chips').write_text('a file where the lock folder goes')
  env = {**os.environ, 'PYTHONPATH': ROOT, 'TMPDIR': str(tmp_path)}
  argv = [sys.executable, '-m', 'sweeps.tpu', f'--chips={chips}', '--', *command]
  proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
  lines = proc.stderr.strip().splitlines()
  assert (proc.returncode, len(lines)) == (2, 1) and error in lines[0], proc.stderr


def test_a_dry_run_prints_each_chips_environment_and_emits_the_launcher(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'sweeps.sweep',
      '--config=configs/digits.py:smoke',
      f'--root={tmp_path}',
      '--tpu-chips',
      '0,1,2,3',
      '--dry-run',
      f'--emit-commands={tmp_path / runner.COMMANDS_FILE}',
      f'--emit-slurm={tmp_path / runner.SLURM_FILE}',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr
  for i in range(4):
    assert f'  TPU chip {i}: {tpu.settings(tpu.environment(i))}' in proc.stdout
  lines = (tmp_path / runner.COMMANDS_FILE).read_text().splitlines()
  assert len(lines) == 48
  assert all(
    line.startswith('python -m sweeps.tpu --chips=0,1,2,3 -- python train.py ') for line in lines
  )
  assert 'eval "$CMD"' in (tmp_path / runner.SLURM_FILE).read_text()


@pytest.mark.parametrize(
  'flags, error',
  [
    (['--tpu-chips', '0,0'], 'two runs cannot share a TPU chip'),
    (['--tpu-chips', '60000'], 'from 0 to 7'),
    (['--tpu-chips', ' , '], 'give comma-separated chip ids'),
    (['--tpu-chips='], 'give comma-separated chip ids'),
    (['--tpu-chips', '0,1', '--gpus', '0'], 'give one of them'),
    (['--tpu-chips', '0,1', '--parallel', '3'], 'exceeds the 2 TPU chips of --tpu-chips'),
  ],
)
def test_bad_chip_flags_are_one_line_before_anything_is_written(tmp_path, flags, error):
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'sweeps.sweep',
      '--config=configs/digits.py:smoke',
      f'--root={tmp_path / "root"}',
      '--dry-run',
      *flags,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
    timeout=600,
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and error in lines[0], proc.stderr
  assert not (tmp_path / 'root').exists()
