"""train_and_evaluate(config, workdir): the whole run, from a resolved config to Orbax results.

Checks the workdir, builds the run context (trainer/run.py: the config against the devices and
the data), builds or restores the state, trains phase by phase with on-device metric sums,
evaluates, checkpoints and writes the results record with each evaluation's predictions
(runrecord/). The same command on the same workdir resumes bit for bit (trainer/resume.py);
non-finite values stop the run as TrainingFailed; SIGTERM/SIGINT as stop.Stopped after a
checkpoint. See docs/operations.md ("A training run"; resuming and stopping).
"""

import contextlib
import dataclasses
import importlib.metadata
import signal
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from configs import validation
from input_pipeline import batching
from numerics import setup as numerics_setup
from runrecord import predictions as prediction_items
from runrecord import record, sessions
from trainer import (
  cadence,
  checkpointing,
  clock,
  execution,
  lock,
  optim,
  resume,
  run,
  steps,
  stop,
  workdirs,
  writers,
)
from trainer.clock import ProgressClock
from trainer.writers import MetricWriter

VERSIONED_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy')


def versions():
  out = {}
  for name in VERSIONED_PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


class TrainingFailed(RuntimeError):
  """The run stopped on a non-finite loss or state; its results record status 'failed'."""


def nonfinite_reason(bad_step, what, per_epoch, last_finite):
  parts = [name for bit, name in ((1, 'training loss'), (2, 'parameters/gradients')) if what & bit]
  return (
    f'non-finite {" and ".join(parts)} at step {bad_step} (epoch '
    f'{(bad_step - 1) // per_epoch + 1}); the last finite state is checkpoint step '
    f'{last_finite}'
  )


def train_and_evaluate(config, workdir, restart=False, allow_layout_change=False):
  """Train and evaluate the resolved `config` (configs/validation.py resolve) in `workdir`; returns
  the final results dict.

  Raises validation.ConfigError on bad input or an unusable workdir (before compute),
  TrainingFailed on a non-finite loss/state, checkpointing.CheckpointWriteError when a checkpoint
  cannot be written, writers.MetricsWriteError when metrics.jsonl cannot, stop.Stopped after a
  SIGTERM/SIGINT. `allow_layout_change`: a saved run may continue on another device layout.
  """
  validation.require_resolved(config, 'trainer.loop.train_and_evaluate')
  created = workdirs.check_workdir(workdir, lock.FILES)
  try:
    with clock.heartbeat(
      f'Loading {config.data.name} and checking it against the config and the devices'
    ):
      ctx = run.build(config)
  except validation.ConfigError:  # refused before anything was written: leave nothing behind
    workdirs.remove_created(created)
    raise
  is_writer = jax.process_index() == 0
  with lock.WorkdirLock(workdir, enabled=is_writer):
    mngr = checkpointing.manager(workdir, config.keep_checkpoints)
    try:
      mngr = resume.check_workdir_run(
        mngr,
        workdir,
        config,
        restart,
        record.data_facts(ctx.dataset),
        execution.facts(),
        allow_layout_change,
      )
      with clock.heartbeat(
        'Initialising the model (compiled once) and looking for a checkpoint to resume from'
      ):
        mngr, progress, completed = _start(ctx, workdir, mngr)
      results = completed if progress is None else _train(ctx, workdir, mngr, progress, is_writer)
    except BaseException:
      checkpointing.close(mngr, quiet=True)  # the error on its way out says what went wrong
      raise
    checkpointing.close(mngr)
  return results


@dataclasses.dataclass(frozen=True)
class Outputs:
  """Where a run reports: the files (writers.create_writers), the throughput and ETA clock
  (trainer/clock.py), the console line (writers.ConsoleWriter)."""

  writers: MetricWriter
  clock: ProgressClock
  console: MetricWriter


@dataclasses.dataclass
class Progress:
  """The loop's mutable state: the training state, the record, and what was last logged/saved."""

  state: Any
  results: dict
  step: int
  last_logged: dict
  last_finite: int
  elapsed_before: float
  saved: int = -1  # the step of the newest checkpoint written (or restored), -1 none
  start_time: float = dataclasses.field(default_factory=time.time)
  predictions: Any = None  # the last evaluation's, until the checkpoint of its step holds them

  def wall_time(self):
    return self.elapsed_before + time.time() - self.start_time


def _start(ctx, workdir, mngr):
  """(mngr, Progress, saved results of a completed run or None): fresh or resumed."""
  config = ctx.config
  model, model_facts = run.init_model(ctx)
  state = run.initial_state(ctx, model)
  with numerics_setup.precision_scope(config):
    numerics = numerics_setup.describe(config)
  facts = execution.facts()
  results = record.new_record(
    config, facts, numerics, record.data_facts(ctx.dataset), model_facts, versions()
  )
  mngr, step, restored, saved = resume.restore(
    mngr, workdir, checkpointing.abstract(state), config.keep_checkpoints
  )
  sessions.start_segment(results, saved, facts, step or 0)
  if step is None:
    return mngr, Progress(state, results, 0, _floats(steps.ZERO_SUMS), 0, 0.0), None
  results.update(history=saved.get('history', []), wall_time_s=saved.get('wall_time_s', 0.0))
  if saved.get('status') == 'completed' and step == ctx.total_steps:
    logging.info('%s already holds a completed run; nothing to do', workdir)
    return mngr, None, saved
  logging.info('Resumed from %s at step %d', record.checkpoint_dir(workdir), step)
  progress = Progress(
    restored,
    results,
    step,
    _floats(saved.get('log_sums', steps.ZERO_SUMS)),
    step,
    results['wall_time_s'],
    saved=step,
  )
  return mngr, progress, None


def _floats(sums):
  return {k: np.float32(v) for k, v in sums.items()}


def _train(ctx, workdir, mngr, p, is_writer):
  logging.info(
    '%s: %d train / %d test examples, %d steps/epoch, %d devices, %d processes',
    ctx.dataset.name,
    len(ctx.dataset.train),
    len(ctx.dataset.test),
    ctx.per_epoch,
    jax.device_count(),
    jax.process_count(),
  )
  timer = clock.ProgressClock(ctx.total_steps, p.step)
  with clock.heartbeat('Opening metrics.jsonl and TensorBoard, building the evaluation step'):
    out = Outputs(
      writers.create_writers(workdir, is_writer, p.step, p.results['history']),
      timer,
      writers.ConsoleWriter(ctx.total_steps, ctx.config.num_epochs, timer),
    )
    eval_fn = run.eval_step(ctx, p.state)
    watch, bad = run.watch(ctx, p.state)
    device_feed = run.feed(ctx)
  if device_feed is not None:
    logging.info(
      'Training split on every device: %.2f GiB each', batching.nbytes(ctx.dataset.train) / 2**30
    )
  out.clock.compiles_ahead(len([f for f in ctx.phases if p.step < f.stop]))
  in_flight = stop.InFlight(stop.STEPS_IN_FLIGHT)
  with stop.StopRequests() as stops:
    for phase in ctx.phases:
      if p.step >= phase.stop:
        continue
      p.state, train_step = run.enter_phase(ctx, p.state, phase, p.step)
      logging.info(
        'Phase %s: steps %d-%d%s',
        phase.name,
        phase.start,
        phase.stop,
        ' (backbone frozen)' if phase.frozen else '',
      )
      entered = p.step
      for batch in run.batches(ctx, p.step, phase.stop, device_feed):
        _stop_if_asked(ctx, mngr, out, p, bad, stops)  # the boundary before step p.step + 1
        if p.step == entered:
          with clock.heartbeat(f'Compiling the training step of phase {phase.name} (once)'):
            p.state = train_step(p.state, batch)  # the first call compiles (seconds to minutes)
        else:
          p.state = train_step(p.state, batch)
        bad = watch(bad, p.state)
        p.step += 1
        in_flight.dispatched(bad)  # the host stays at most STEPS_IN_FLIGHT steps ahead
        if p.step == entered + 1:
          out.clock.compiled(entered)  # the phase's first call compiled its step function
        _after_step(ctx, mngr, out, p, bad, eval_fn)
    checkpointing.wait(mngr, p.step)  # a signal now changes nothing: the run is complete
  out.writers.close()
  logging.info(
    'Done: test_accuracy %s, %s',
    writers.percent(p.results['final']['test_accuracy']),
    session_times(p),
  )
  return p.results


def session_times(p):
  """'12.3 s' for a run trained in one session; 'this session 12.3 s, all sessions 157.7 s' for a
  resumed one (its wall_time_s counts every session)."""
  if not p.elapsed_before:
    return f'{p.wall_time():.1f} s'
  return f'this session {time.time() - p.start_time:.1f} s, all sessions {p.wall_time():.1f} s'


def _after_step(ctx, mngr, out, p, bad, eval_fn):
  """Whatever is due after step `p.step` (trainer/cadence.py): the non-finite check, log, epoch
  end and evaluation, checkpoint."""
  due = cadence.due(ctx, p.step)
  if due.check:
    _ensure_finite(ctx, mngr, out, p, bad)
  if due.log:
    _log(ctx, out, p)
  if due.epoch:
    _end_epoch(ctx, out, p, eval_fn, due.evaluate)
  if due.save:
    with out.clock.paused():  # not training time (images/s)
      _checkpoint(ctx, mngr, p, 'completed' if p.step == ctx.total_steps else 'running')


def _stop_if_asked(ctx, mngr, out, p, bad, stops):
  """At the step boundary before step `p.step + 1` is dispatched (what step `p.step` was due is
  done): if a signal asked for a stop (every process agreeing, stop.StopRequests.agreed), save step
  `p.step` (unless its checkpoint is already written) and raise stop.Stopped. Nothing is dispatched
  after the signal is read: the stop waits for the steps in flight (stop.InFlight) only."""
  signum = stops.agreed(cadence.due(ctx, p.step).check)
  if not signum:
    return
  if p.step == 0:  # nothing trained yet: nothing to save
    raise stop.Stopped(signum, None)
  logging.warning(
    '%s: stopping after step %d; its checkpoint is being written (a second signal stops at once)',
    signal.Signals(signum).name,
    p.step,
  )
  if p.saved != p.step:
    _ensure_finite(ctx, mngr, out, p, bad)
    with out.clock.paused():
      _checkpoint(ctx, mngr, p)
  checkpointing.wait(mngr, p.step)
  out.writers.close()
  raise stop.Stopped(signum, p.step)


def save(mngr, step, results, state=None, predictions=None):
  """The run's results (and state, and an evaluation's predictions) as checkpoint step `step`:
  <workdir>/checkpoints/<step>/{results, state, predictions} (record.save). The previous
  asynchronous write is waited for first, so that its failure names its own step."""
  checkpointing.wait(mngr)
  with checkpointing.write_errors(step):
    record.save(mngr, step, results, state, prediction_items.save_items(predictions))


def save_state(mngr, step, state, results, predictions=None):
  """`state` and `results` (and `predictions`) as checkpoint step `step` (save), `results` first
  given the state's digest (results['state_digest'], set here: what a restore checks the state
  against)."""
  results['state_digest'] = checkpointing.state_digest(state)
  save(mngr, step, results, state, predictions)


def _checkpoint(ctx, mngr, p, status='running'):
  p.results.update(
    status=status,
    step=p.step,
    total_steps=ctx.total_steps,
    wall_time_s=p.wall_time(),
    log_sums={k: float(v) for k, v in p.last_logged.items()},
  )
  sessions.end_segment(p.results, p.step)
  save_state(mngr, p.step, p.state, p.results, p.predictions)
  p.predictions = None
  p.last_finite = p.saved = p.step


def _ensure_finite(ctx, mngr, out, p, bad):
  """At sync points only: stop the run if any step so far produced a non-finite value."""
  bad_step, what = (int(v) for v in jax.device_get(bad))
  if bad_step < 0:
    return
  reason = nonfinite_reason(bad_step, what, ctx.per_epoch, p.last_finite)
  p.results.update(
    status='failed',
    reason=reason,
    failed_step=bad_step,
    step=p.step,
    total_steps=ctx.total_steps,
    wall_time_s=p.wall_time(),
  )
  p.results.pop('state_digest', None)  # this step saves no state
  save(mngr, p.step, p.results)  # results only: the state is not finite
  checkpointing.wait(mngr, p.step)
  out.writers.close()
  raise TrainingFailed(reason)


def _log(ctx, out, p):
  """The training loss and accuracy since the last log: console, metrics.jsonl, TensorBoard."""
  config, step = ctx.config, p.step
  sums = jax.device_get(p.state['sums'])
  images_per_sec, eta = out.clock.throughput(step, config.batch_size)
  count = max(sums['count'] - p.last_logged['count'], 1.0)
  loss = (sums['loss'] - p.last_logged['loss']) / count
  accuracy = (sums['correct'] - p.last_logged['correct']) / count
  p.last_logged = sums
  epoch = (step - 1) // ctx.per_epoch  # 0-based epoch this step belongs to
  lr = optim.learning_rate(config, ctx.per_epoch, ctx.phases, step - 1)
  entry = {
    'kind': 'train',
    'step': step,
    'epoch': epoch + 1,
    'train_loss': float(loss),
    'train_accuracy': float(accuracy),
    'learning_rate': lr,
    'images_per_sec': images_per_sec,
  }
  out.console.write_scalars(step, {**entry, 'eta_s': eta})
  out.writers.write_scalars(step, entry)


def _end_epoch(ctx, out, p, eval_fn, evaluate_now):
  """The epoch's record (training sums, and the evaluation when due); sums reset on device."""
  epoch = p.step // ctx.per_epoch
  sums = jax.device_get(p.state['sums'])
  entry = {
    'kind': 'epoch',
    'epoch': epoch,
    'step': p.step,
    'train_loss': float(sums['loss'] / sums['count']),
    'train_accuracy': float(sums['correct'] / sums['count']),
  }
  if evaluate_now:
    first = out.clock.first_evaluation  # it compiles the evaluation step first
    with (
      out.clock.paused(),
      (
        clock.heartbeat('Compiling the evaluation step and evaluating')
        if first
        else contextlib.nullcontext()
      ),
    ):
      metrics, p.predictions = run.evaluate(ctx, eval_fn, p.state)
      entry.update(metrics)
    out.clock.evaluated(p.step)
    logging.info(
      'epoch %d: test_accuracy %s test_loss %.4f train_loss %.4f',
      epoch,
      writers.percent(entry['test_accuracy']),
      entry['test_loss'],
      entry['train_loss'],
    )
  entry['wall_time_s'] = p.wall_time()
  out.writers.write_scalars(entry['step'], entry)
  p.results['history'].append({k: v for k, v in entry.items() if k != 'kind'})
  p.state['sums'] = steps.zero_sums(ctx.mesh)
  p.last_logged = _floats(steps.ZERO_SUMS)
  if p.step == ctx.total_steps:
    p.results['final'] = record.final_metrics(p.results['history'])
