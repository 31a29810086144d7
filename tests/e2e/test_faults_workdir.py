"""A workdir train.py cannot use: every checkpoint damaged, or an entry of the run layout that is
the wrong kind (a `checkpoints` file). Each is one line on stderr, exit 2, nothing overwritten."""

import os
import subprocess
import sys

import numpy as np
import pytest

from configs import common, validation
from tests.conftest import ROOT
from tests.support.faults_common import EVERY, SMOKE_ARGS, last_line, run_train, tree_hash
from trainer import checkpoint

# Orbax's own coroutine for one array read, dropped while its read is in flight: what a failed
# restore leaves behind for every other array (trainer/checkpoint.py restore_newest_valid).
ABANDONED_READ = r"""
import sys
import tensorstore as ts
from orbax.checkpoint._src.serialization import limits, serialization
from trainer import process

class InFlight:
  def __await__(self):
    yield

async def read_in_flight(**_):
  await InFlight()

serialization._read_shard = read_in_flight  # the read of the array's data, not finished
store = ts.open({'driver': 'zarr', 'kvstore': {'driver': 'memory'}}, create=True, shape=[4],
                dtype=ts.float32).result()
if sys.argv[1] == 'quiet':
  process.quiet_abandoned_work()
coro = serialization._read_array_index_and_device_put(
    [], (slice(0, 4),), store, global_shape=(4,), new_shard_shape=(4,), dtype=None,
    byte_limiter=limits.get_byte_limiter(), strict=True, dll=None, memory_kind=None)
coro.send(None)  # suspended inside Orbax's try around the read
del coro  # closed: Orbax's `except BaseException` turns the GeneratorExit into an Exception
print('error: the one line', file=sys.stderr)
"""


def test_orbax_reads_abandoned_by_a_failed_restore_print_nothing(subprocess_env):
  """Every checkpoint damaged: the one-line error came at line 4,685 of 9,684 lines, one
  ~65-line traceback per array read in flight when the restore failed (how many depends on
  timing: 20 to 108 in runs of a width-1.0 state on 8 devices). train.py's hook drops them."""
  noisy, quiet = (
    subprocess.run(
      [sys.executable, '-c', ABANDONED_READ, mode],
      cwd=ROOT,
      env=subprocess_env,
      capture_output=True,
      text=True,
    )
    for mode in ('noisy', 'quiet')
  )
  assert (
    'Exception ignored in: <coroutine object _read_array_index_and_device_put' in noisy.stderr
    and 'Traceback' in noisy.stderr
  )  # the noise, without the hook
  assert quiet.stderr == 'error: the one line\n' and quiet.returncode == 0


@pytest.mark.timeout(300)
def test_every_checkpoint_damaged_is_one_line_and_changes_nothing(tmp_path, subprocess_env):
  """Steps that Orbax cannot read (a state of other arrays, its data files cut short)."""
  config = validation.resolve(
    common.load('configs/digits.py:smoke', [('checkpoint_every_steps', EVERY)])
  )
  state = {'params': {'w': np.arange(4096.0)}}
  workdir = tmp_path / 'w'
  mngr = checkpoint.manager(str(workdir), 3)
  for step in (40, 44):
    checkpoint.save(mngr, step, {'status': 'running', 'config': config.to_dict()}, state)
  checkpoint.close(mngr)
  for path in (workdir / 'checkpoints').rglob('*'):
    if path.is_file() and path.parent.name == 'd':
      os.truncate(path, min(path.stat().st_size, 100))
  before = tree_hash(workdir / 'checkpoints')
  proc = run_train(SMOKE_ARGS + [f'--workdir={workdir}'], subprocess_env)
  assert proc.returncode == 2, proc.stderr[-3000:]
  last, only_logs = last_line(proc.stderr)
  assert last.startswith(
    f'error: no checkpoint in {workdir}/checkpoints can be restored (steps [40, 44] are damaged)'
  )
  assert only_logs and 'Traceback' not in proc.stderr, proc.stderr[:3000]
  assert tree_hash(workdir / 'checkpoints') == before


@pytest.mark.parametrize(
  'entry, make',
  [
    ('checkpoints', lambda p: p.write_text('not a folder')),
    ('metrics.jsonl', lambda p: p.mkdir()),
    ('tensorboard', lambda p: p.write_text('')),
    ('checkpoints/40', lambda p: (p.parent.mkdir(), p.write_text('x'))),
  ],
)
def test_a_layout_entry_of_the_wrong_kind_is_refused_before_training(
  entry, make, tmp_path, subprocess_env
):
  """Before: a `checkpoints` file was found at the first save, after a fresh start had rewritten
  the completed run's metrics.jsonl (25 lines -> 1)."""
  workdir = tmp_path / 'w'
  workdir.mkdir()
  if entry != 'metrics.jsonl':
    (workdir / 'metrics.jsonl').write_text(''.join(f'{{"step": {i}}}\n' for i in range(25)))
  make(workdir / entry)
  before = tree_hash(workdir)
  proc = run_train(['--config=configs/digits.py:smoke', f'--workdir={workdir}'], subprocess_env)
  assert proc.returncode == 2, proc.stderr[-3000:]
  kind = 'folder' if entry == 'metrics.jsonl' else 'file'
  assert proc.stderr.strip().splitlines()[-1] == (
    f'error: --workdir: {workdir}/{entry} is a {kind}, not the '
    f'{"file" if kind == "folder" else "folder"} a run keeps there: move it out of the workdir '
    '(or fix its permissions), or use another --workdir; nothing was written'
  )
  assert 'Traceback' not in proc.stderr and tree_hash(workdir) == before
