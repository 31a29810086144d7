"""Preemption, damaged checkpoints, NaN, the workdir lock and config mismatch, disk full.

One uninterrupted reference run (in this process) is compared with runs of train.py that are
killed with SIGKILL at chosen moments (tests/support/fault_injection.py: during a step, inside a
checkpoint write, during eval) and at an arbitrary moment from outside, then started again with the
same command; with runs whose checkpoint bytes or metrics file were damaged; and with a run that
fills a real small disk (a tmpfs in a private mount namespace where the machine allows one, else an
injected ENOSPC), then resumes once space is free.
"""

import errno
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from analysis import inputs, stats
from configs import validation
from runrecord import record, rules
from tests.conftest import ROOT
from tests.support import fault_injection, faults_common
from tests.support.faults_common import (
  SMOKE_ARGS,
  TRAIN,
  metric_records,
  run_train,
  smoke_config,
  tree_hash,
  without_wall_time,
)
from trainer import checkpoint, train


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  return faults_common.reference_run(tmp_path_factory)


@pytest.mark.timeout(600)
def test_killed_at_any_moment_resumes_bit_identical(reference, tmp_path, subprocess_env):
  ref_dir, ref = reference
  workdir = tmp_path / 'w'
  args = SMOKE_ARGS + [f'--workdir={workdir}']
  ckpt = workdir / 'checkpoints'

  def steps_saved():
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())

  # During a step (step 6 dispatched; the asynchronous write of step 4 may or may not be done).
  proc = run_train(args, subprocess_env, fault='kill@step:6')
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  assert steps_saved() in ([], [4])
  # Inside the checkpoint write of step 12 (Orbax waits for step 8's write before it starts 12):
  # an unfinished write that must not count as a step.
  proc = run_train(args, subprocess_env, fault='kill@save:12')
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  assert 8 in steps_saved() and 12 not in steps_saved(), steps_saved()
  # During the evaluation after epoch 1 (step 22 trained; steps up to 16 or 20 saved).
  proc = run_train(args, subprocess_env, fault='kill@eval:1')
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  assert 'Resumed' in proc.stderr and 'at step 8' in proc.stderr
  assert max(steps_saved()) in (16, 20)
  # From outside, at whatever moment the run has reached once epoch 2 has started logging.
  process = subprocess.Popen(
    TRAIN + args, cwd=ROOT, env=subprocess_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  deadline = time.time() + 240
  metrics = workdir / 'metrics.jsonl'
  while time.time() < deadline and process.poll() is None:
    if metrics.exists() and any(r['step'] > 26 for r in metric_records(workdir)):
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=30)
  # The same command again finishes the run.
  proc = run_train(args, subprocess_env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  final = record.read_results(str(workdir))
  assert final['status'] == 'completed'
  assert without_wall_time(final) == without_wall_time(ref)  # accuracy, losses, history: bitwise
  assert metric_records(workdir) == metric_records(ref_dir)  # every logged step, once, same values
  assert not list(ckpt.glob('*orbax-checkpoint-tmp*'))


@pytest.mark.timeout(300)
def test_damaged_latest_checkpoint_falls_back_to_newest_valid(reference, tmp_path, caplog):
  ref_dir, ref = reference
  workdir = tmp_path / 'damaged'
  shutil.copytree(ref_dir, workdir)
  # Truncate every data file of the final step's state: a finalized step with damaged files.
  for path in (workdir / 'checkpoints' / '44' / 'state').rglob('*'):
    if path.is_file() and path.parent.name == 'd':
      path.write_bytes(path.read_bytes()[:10])
  again = train.train_and_evaluate(smoke_config(), str(workdir))
  assert 'Checkpoint step 44 cannot be restored' in caplog.text
  assert 'Resuming from step 40' in caplog.text
  assert without_wall_time(again) == without_wall_time(ref)
  assert [p.name.split('-')[0] for p in (workdir / checkpoint.CORRUPT_DIR).iterdir()] == ['44']


@pytest.mark.timeout(300)
def test_flipped_byte_in_state_data_is_caught_by_the_digest(reference, tmp_path, caplog):
  """One flipped byte in the largest data file of the newest checkpoint's state: Orbax restores
  it without complaint, the digest saved beside it does not match, the run falls back to step 40
  with a warning naming step 44, and ends bit-identical."""
  ref_dir, ref = reference
  workdir = tmp_path / 'flipped'
  shutil.copytree(ref_dir, workdir)
  data_files = [
    p
    for p in (workdir / 'checkpoints' / '44' / 'state').rglob('*')
    if p.is_file() and p.parent.name == 'd'
  ]
  target = max(data_files, key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x01
  target.write_bytes(bytes(data))
  again = train.train_and_evaluate(smoke_config(), str(workdir))
  assert 'Checkpoint step 44 cannot be restored (ValueError: state digest' in caplog.text
  assert 'Resuming from step 40' in caplog.text
  assert without_wall_time(again) == without_wall_time(ref)
  assert ref['state_digest'] == again['state_digest']


@pytest.mark.timeout(300)
def test_torn_last_metrics_line_is_dropped_at_resume(reference, tmp_path, caplog):
  ref_dir, ref = reference
  workdir = tmp_path / 'torn'
  shutil.copytree(ref_dir, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '44')
  metrics = workdir / 'metrics.jsonl'
  lines = metrics.read_text().splitlines()
  # The crash cut the write of step 44's record (after step 40's checkpoint) mid-line.
  metrics.write_text('\n'.join(lines[:-2]) + '\n' + lines[-2][:25])
  again = train.train_and_evaluate(smoke_config(), str(workdir))
  assert f'metrics.jsonl line {len(lines) - 1} is not a whole JSON record' in caplog.text
  assert without_wall_time(again) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


def _tmpfs_runner(mount_point):
  """A command prefix that runs a shell script with a private tmpfs at `mount_point` (`$M`), or
  None where this machine allows no mount namespace (then the test injects ENOSPC instead)."""
  for prefix in (['unshare', '-rm'], ['unshare', '-m']):
    probe = subprocess.run(
      prefix + ['sh', '-c', f'mount -t tmpfs -o size=1m tmpfs {mount_point}'], capture_output=True
    )
    if probe.returncode == 0:
      return prefix
  return None


DISK_FULL = re.compile(
  r'error: checkpoint of step (\d+) could not be written \(No space left on '
  r'device\); the checkpoints already saved are unchanged: free space'
)


@pytest.mark.timeout(600)
def test_disk_full_mid_run_is_one_line_and_the_run_resumes(reference, tmp_path, subprocess_env):
  """A 3 MB disk fills at the third or fourth checkpoint: one line naming the step whose write
  failed, exit 1, no traceback; once space is free the same command resumes and ends
  bit-identical to the reference."""
  ref_dir, ref = reference
  mount = tmp_path / 'disk'
  mount.mkdir()
  runner = _tmpfs_runner(mount)
  workdir, out = mount / 'w', tmp_path / 'out'
  out.mkdir()
  command = ' '.join(TRAIN + SMOKE_ARGS + [f'--workdir={workdir}'])
  if runner:
    script = (
      f'mount -t tmpfs -o size=3m tmpfs {mount} && cd {ROOT} && '
      f'{command} 2> {out}/full.err; echo $? > {out}/full.rc; cp -a {workdir} {out}/full; '
      f'mount -o remount,size=64m {mount} && {command} 2> {out}/again.err; '
      f'echo $? > {out}/again.rc; cp -a {workdir} {out}/again'
    )
    subprocess.run(runner + ['sh', '-c', script], env=subprocess_env, timeout=500)
  else:  # no mount namespace here: the same failure, injected where the write would fail
    full = run_train(SMOKE_ARGS + [f'--workdir={workdir}'], subprocess_env, fault='enospc@save:12')
    again = run_train(SMOKE_ARGS + [f'--workdir={workdir}'], subprocess_env)
    for name, proc in (('full', full), ('again', again)):
      (out / f'{name}.err').write_text(proc.stderr)
      (out / f'{name}.rc').write_text(str(proc.returncode))
      shutil.copytree(workdir, out / name)
  err = (out / 'full.err').read_text()
  assert (out / 'full.rc').read_text().strip() == '1', err[-3000:]
  last, only_logs = faults_common.last_line(err)
  match = DISK_FULL.match(last)
  assert match and only_logs and 'Traceback' not in err, err[-3000:]
  failed = int(match.group(1))
  assert failed >= 8 and failed % 4 == 0
  assert max(faults_common.saved_steps(out / 'full')) == failed - 4  # the write before it is whole
  assert (out / 'again.rc').read_text().strip() == '0', (out / 'again.err').read_text()[-3000:]
  assert f'at step {failed - 4}' in (out / 'again.err').read_text()
  assert without_wall_time(record.read_results(str(out / 'again'))) == without_wall_time(ref)
  assert metric_records(out / 'again') == metric_records(ref_dir)


@pytest.mark.timeout(300)
def test_failed_save_is_reported_once_when_close_fails_too(tmp_path, monkeypatch):
  """The write of step 4 fails; closing the manager then fails with Orbax's own error for it (as
  a pending asynchronous write does): the caller gets the one CheckpointWriteError of step 4."""
  real_close = ocp.CheckpointManager.close

  def failing_close(self):
    real_close(self)
    raise ValueError("RESOURCE_EXHAUSTED: Error writing ...: [os_error_code='28']")

  monkeypatch.setattr(ocp.CheckpointManager, 'close', failing_close)
  fault_injection.install('enospc@save:4', monkeypatch.setattr)
  with pytest.raises(checkpoint.CheckpointWriteError) as e:
    train.train_and_evaluate(smoke_config(), str(tmp_path / 'w'))
  assert str(e.value).startswith(
    'checkpoint of step 4 could not be written (No space left on device)'
  )
  # Without an error on its way out, the failed close is the error (read from Orbax's message).
  mngr = checkpoint.manager(str(tmp_path / 'other'), 3)
  with pytest.raises(checkpoint.CheckpointWriteError, match=r'No space left on device'):
    checkpoint.close(mngr)


@pytest.mark.timeout(300)
def test_nan_stops_naming_the_step_and_analysis_excludes_it(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / 'runs' / 'diverged'
  config = smoke_config(
    **{'optim.learning_rate': 1e30, 'log_every_steps': 2, 'checkpoint_every_steps': 2}
  )
  with pytest.raises(train.TrainingFailed, match=r'non-finite .* at step (\d+) \(epoch 1\)') as e:
    train.train_and_evaluate(config, str(workdir))
  saved = record.read_results(str(workdir))
  assert saved['status'] == 'failed' and saved['reason'] == str(e.value)
  bad_step = saved['failed_step']
  assert f'at step {bad_step} ' in str(e.value)
  # The state steps kept are the last finite ones, all before the failing step.
  mngr = checkpoint.manager(str(workdir), 3)
  state_steps = [
    s for s in mngr.all_steps() if (workdir / 'checkpoints' / str(s) / 'state').exists()
  ]
  assert state_steps and max(state_steps) < bad_step
  kept = mngr.restore(max(state_steps), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(kept['state']['params']))
  mngr.close()
  # analysis.stats excludes the failed run and says why.
  shutil.copytree(ref_dir, tmp_path / 'runs' / 'reference')
  prepared = stats.prepare(
    inputs.runs_frame(inputs.read_all(str(tmp_path / 'runs'))), [], 'final.test_accuracy'
  )
  excluded = prepared.excluded
  assert list(excluded['run']) == [str(workdir)]
  assert 'failed: non-finite' in excluded['reason'].iloc[0]
  assert len(prepared.runs) == 1
  # The same command refuses the failed workdir; --restart discards it and fails the same way.
  with pytest.raises(validation.ConfigError, match=f'failed at step {bad_step}'):
    train.train_and_evaluate(config, str(workdir))
  with pytest.raises(train.TrainingFailed) as again:
    train.train_and_evaluate(config, str(workdir), restart=True)
  assert str(again.value) == str(e.value)


def test_lock_refuses_live_holder_and_takes_over_stale(tmp_path):
  with checkpoint.WorkdirLock(tmp_path):
    with pytest.raises(checkpoint.WorkdirLocked, match=f'pid {os.getpid()} on '):
      checkpoint.WorkdirLock(tmp_path).acquire()
  # A lock file left by a process that died (kill -9 leaves it behind): taken over.
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  (tmp_path / record.LOCK_FILE).write_text(json.dumps({'pid': dead.pid, 'host': 'h'}))
  taken = checkpoint.WorkdirLock(tmp_path).acquire()
  assert taken.previous['pid'] == dead.pid
  assert json.loads((tmp_path / record.LOCK_FILE).read_text())['pid'] == os.getpid()
  taken.release()


def test_lock_holds_when_run_lock_is_deleted(tmp_path):
  with checkpoint.WorkdirLock(tmp_path):
    (tmp_path / record.LOCK_FILE).unlink()
    with pytest.raises(
      checkpoint.WorkdirLocked, match='in use by a live run .*run.lock was deleted'
    ):
      checkpoint.WorkdirLock(tmp_path).acquire()
    assert checkpoint.holder(tmp_path) == {}  # held, by a process run.lock no longer names
  assert checkpoint.holder(tmp_path) is None
  with checkpoint.WorkdirLock(tmp_path):  # released: free again
    pass


def test_lock_falls_back_to_the_file_where_folders_cannot_be_locked(tmp_path, monkeypatch):
  """NFS emulates flock with write locks, which a folder (opened read-only) cannot take: ENOLCK.
  The lock then holds on run.lock itself."""
  real_flock = checkpoint.fcntl.flock

  def no_folder_locks(fd, operation):
    if stat.S_ISDIR(os.fstat(fd).st_mode) and operation != checkpoint.fcntl.LOCK_UN:
      raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    return real_flock(fd, operation)

  monkeypatch.setattr(checkpoint.fcntl, 'flock', no_folder_locks)
  with checkpoint.WorkdirLock(tmp_path):
    with pytest.raises(checkpoint.WorkdirLocked, match=f'pid {os.getpid()} on '):
      checkpoint.WorkdirLock(tmp_path).acquire()
    assert checkpoint.holder(tmp_path)['pid'] == os.getpid()
  assert checkpoint.holder(tmp_path) is None
  checkpoint.WorkdirLock(tmp_path).acquire().release()


def test_config_comparison_ignores_only_non_arithmetic_fields():
  saved = smoke_config().to_dict()
  same = smoke_config(
    log_every_steps=1,
    checkpoint_every_steps=0,
    keep_checkpoints=9,
    **{
      'data.prefetch': 0,
      'data.on_device': True,
      'distributed.num_processes': 2,
      'distributed.coordinator_address': 'localhost:1234',  # required beside num_processes
      'distributed.process_id': 1,
    },
  )
  assert rules.config_differences(saved, same.to_dict()) == []
  assert rules.config_differences(saved, smoke_config(eval_batch_size=128).to_dict()) == [
    'eval_batch_size: 256 -> 128'
  ]
  assert rules.config_differences(
    saved, smoke_config(**{'numerics.conv_format': 'bf16'}).to_dict()
  ) == ["numerics.conv_format: 'native' -> 'bf16'"]


# Bad input against a workdir that already holds a run (interrupted after step 40): each fails
# with one line and a non-zero exit, and leaves the saved checkpoints byte-for-byte unchanged.
EXISTING_RUN_CASES = [
  (
    'different_config',
    ['--config.seed=1'],
    None,
    2,
    'holds a run with a different config (seed: 0 -> 1)',
  ),
  (
    'different_numerics',
    ['--config.numerics.conv_format=bf16'],
    None,
    2,
    "numerics.conv_format: 'native' -> 'bf16'",
  ),
  ('live_lock', [], None, 2, 'is in use by a live run (pid'),
  (
    'disk_full',
    [],
    'enospc@save:44',
    1,
    'checkpoint of step 44 could not be written (No space left on device)',
  ),
  (
    'unknown_numerics',
    ['--config.numerics.matmul_precision=fastest'],
    None,
    2,
    'config.numerics.matmul_precision',
  ),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
  'name,extra,fault,code,message', EXISTING_RUN_CASES, ids=[c[0] for c in EXISTING_RUN_CASES]
)
def test_bad_input_leaves_existing_run_untouched(
  name, extra, fault, code, message, reference, tmp_path, subprocess_env
):
  ref_dir, _ = reference
  workdir = tmp_path / 'existing'
  shutil.copytree(ref_dir, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '44')
  before = tree_hash(workdir / 'checkpoints')
  holder = checkpoint.WorkdirLock(workdir).acquire() if name == 'live_lock' else None
  try:
    proc = run_train(SMOKE_ARGS + extra + [f'--workdir={workdir}'], subprocess_env, fault=fault)
  finally:
    if holder:
      holder.release()
  assert proc.returncode == code, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr
  assert tree_hash(workdir / 'checkpoints') == before
