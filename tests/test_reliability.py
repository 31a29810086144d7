"""Preemption, damaged checkpoints, NaN, the workdir lock and config mismatch, disk full.

One uninterrupted reference run (in this process) is compared with runs of train.py that are
killed with SIGKILL at chosen moments (trainer/faults.py: during a step, inside a checkpoint write,
during eval) and at an arbitrary moment from outside, then started again with the same command.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from analysis import results as results_lib
from analysis import stats
from configs import digits
from tests.conftest import ROOT
from trainer import checkpointing, lock, loop, record, validation

TRAIN = [sys.executable, os.path.join(ROOT, 'train.py')]
EVERY = 4  # checkpoint_every_steps: 22 steps per epoch, so mid-epoch steps 4, 8, ..., 40
SMOKE_ARGS = ['--config=configs/digits.py:smoke', f'--config.checkpoint_every_steps={EVERY}']


def smoke_config(**overrides):
  c = digits.get_config('smoke')
  c.checkpoint_every_steps = EVERY
  for key, value in overrides.items():
    if '.' in key:
      c[key.split('.')[0]][key.split('.')[1]] = value
    else:
      c[key] = value
  return c


def run_train(args, env, fault=None, timeout=240):
  env = dict(env)
  if fault:
    env['TRAIN_FAULT'] = fault
  return subprocess.run(TRAIN + args, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


def without_wall_time(results):
  results = json.loads(json.dumps(results))  # as saved: tuples become lists
  out = {k: v for k, v in results.items() if k != 'wall_time_s'}
  out['history'] = [{k: v for k, v in h.items() if k != 'wall_time_s'} for h in results['history']]
  return out


def metric_records(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in ('wall_time_s', 'images_per_sec')}
          for l in lines]


def tree_hash(folder):
  digest = hashlib.sha256()
  for path in sorted(p for p in folder.rglob('*') if p.is_file()):
    digest.update(str(path.relative_to(folder)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('reliability') / 'reference'
  results = loop.train_and_evaluate(smoke_config(), str(workdir))
  return workdir, results


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
  process = subprocess.Popen(TRAIN + args, cwd=ROOT, env=subprocess_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
  again = loop.train_and_evaluate(smoke_config(), str(workdir))
  assert 'Checkpoint step 44 cannot be restored' in caplog.text
  assert 'Resuming from step 40' in caplog.text
  assert without_wall_time(again) == without_wall_time(ref)
  assert [p.name.split('-')[0] for p in (workdir / checkpointing.CORRUPT_DIR).iterdir()] == ['44']


@pytest.mark.timeout(300)
def test_nan_stops_naming_the_step_and_analysis_excludes_it(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / 'runs' / 'diverged'
  config = smoke_config(**{'optim.learning_rate': 1e30, 'log_every_steps': 2,
                           'checkpoint_every_steps': 2})
  with pytest.raises(loop.TrainingFailed, match=r'non-finite .* at step (\d+) \(epoch 1\)') as e:
    loop.train_and_evaluate(config, str(workdir))
  saved = record.read_results(str(workdir))
  assert saved['status'] == 'failed' and saved['reason'] == str(e.value)
  bad_step = saved['failed_step']
  assert f'at step {bad_step} ' in str(e.value)
  # The state steps kept are the last finite ones, all before the failing step.
  mngr = checkpointing.manager(str(workdir), 3)
  state_steps = [s for s in mngr.all_steps() if (workdir / 'checkpoints' / str(s) / 'state').exists()]
  assert state_steps and max(state_steps) < bad_step
  import orbax.checkpoint as ocp
  kept = mngr.restore(max(state_steps), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(kept['state']['params']))
  mngr.close()
  # analysis.stats excludes the failed run and says why.
  shutil.copytree(ref_dir, tmp_path / 'runs' / 'reference')
  prepared = stats.prepare(results_lib.runs_frame(results_lib.read_all(str(tmp_path / 'runs'))),
                           [], 'final.test_accuracy')
  excluded = prepared['excluded']
  assert list(excluded['run']) == [str(workdir)]
  assert f'failed: non-finite' in excluded['reason'].iloc[0]
  assert len(prepared['runs']) == 1
  # The same command refuses the failed workdir; --restart discards it and fails the same way.
  with pytest.raises(validation.ConfigError, match=f'failed at step {bad_step}'):
    loop.train_and_evaluate(config, str(workdir))
  with pytest.raises(loop.TrainingFailed) as again:
    loop.train_and_evaluate(config, str(workdir), restart=True)
  assert str(again.value) == str(e.value)


def test_lock_refuses_live_holder_and_takes_over_stale(tmp_path):
  with lock.WorkdirLock(tmp_path):
    with pytest.raises(lock.WorkdirLocked, match=f'pid {os.getpid()} on '):
      lock.WorkdirLock(tmp_path).acquire()
  # A lock file left by a process that died (kill -9 leaves it behind): taken over.
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  (tmp_path / lock.LOCK_FILE).write_text(json.dumps({'pid': dead.pid, 'host': 'h'}))
  taken = lock.WorkdirLock(tmp_path).acquire()
  assert taken.previous['pid'] == dead.pid
  assert json.loads((tmp_path / lock.LOCK_FILE).read_text())['pid'] == os.getpid()
  taken.release()


def test_config_comparison_ignores_only_non_arithmetic_fields():
  saved = smoke_config().to_dict()
  same = smoke_config(log_every_steps=1, checkpoint_every_steps=0, keep_checkpoints=9)
  same.data.prefetch = 0
  same.data.on_device = True
  same.distributed.num_processes = 2
  assert record.config_differences(saved, same.to_dict()) == []
  assert record.config_differences(saved, smoke_config(eval_batch_size=128).to_dict()) == [
      'eval_batch_size: 256 -> 128']
  assert record.config_differences(
      saved, smoke_config(**{'numerics.emulate': 'bf16'}).to_dict()) == [
      "numerics.emulate: 'none' -> 'bf16'"]


# Bad input against a workdir that already holds a run (interrupted after step 40): each fails
# with one line and a non-zero exit, and leaves the saved checkpoints byte-for-byte unchanged.
EXISTING_RUN_CASES = [
    ('different_config', ['--config.seed=1'], None, 2,
     'holds a run with a different config (seed: 0 -> 1)'),
    ('different_numerics', ['--config.numerics.emulate=bf16'], None, 2,
     "numerics.emulate: 'none' -> 'bf16'"),
    ('live_lock', [], None, 2, 'is in use by a live run (pid'),
    ('disk_full', [], 'enospc@save:44', 1,
     'checkpoint of step 44 could not be written (No space left on device)'),
    ('unknown_numerics', ['--config.numerics.matmul_precision=fastest'], None, 2,
     'config.numerics.matmul_precision'),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize('name,extra,fault,code,message', EXISTING_RUN_CASES,
                         ids=[c[0] for c in EXISTING_RUN_CASES])
def test_bad_input_leaves_existing_run_untouched(name, extra, fault, code, message, reference,
                                                 tmp_path, subprocess_env):
  ref_dir, _ = reference
  workdir = tmp_path / 'existing'
  shutil.copytree(ref_dir, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '44')
  before = tree_hash(workdir / 'checkpoints')
  holder = lock.WorkdirLock(workdir).acquire() if name == 'live_lock' else None
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
