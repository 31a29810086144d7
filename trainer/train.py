"""train_and_evaluate(config, workdir) and the steps it runs, as in flax's examples/imagenet:
`train_step`, `eval_step`, `create_train_state`, the loop."""

import contextlib
import dataclasses
import functools
import operator
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax import lax

from configs import validation
from input_pipeline import batching
from numerics import ops
from numerics import setup as numerics_setup
from runrecord import record, rules
from trainer import checkpoint, metrics, process, run


class TrainingFailed(RuntimeError):
  """The run stopped on a non-finite loss or state; its results record status 'failed'."""


def preprocess(images, mean, std, flip_key=None):
  """uint8 NHWC -> normalised float32 on device; optional random horizontal flips."""
  x = (images.astype(jnp.float32) / 255.0 - mean) / std
  if flip_key is not None:
    flips = jax.random.bernoulli(flip_key, 0.5, (x.shape[0],))
    x = jnp.where(flips[:, None, None, None], x[:, :, ::-1, :], x)
  return x


def label_logits(logits, labels):
  """logits[i, labels[i]] without a gather (whose gradient is a scatter), exactly."""
  num_classes = logits.shape[-1]
  labels = jnp.where(labels < 0, labels + num_classes, labels)
  hit = labels[..., None] == lax.broadcasted_iota(labels.dtype, logits.shape, logits.ndim - 1)
  picked = jnp.sum(jnp.where(hit, logits, jnp.zeros((), logits.dtype)), axis=-1)
  return jnp.where(jnp.any(hit, axis=-1), picked, jnp.full((), jnp.nan, logits.dtype))


@jax.custom_vjp
def softmax_cross_entropy(logits, labels):
  """optax.softmax_cross_entropy_with_integer_labels bit for bit, values and gradients, with no
  gather forward or scatter backward (XLA's deterministic GPU mode sorts a scatter's indices)."""
  return jax.nn.logsumexp(logits, axis=-1) - label_logits(logits, labels)


def _cross_entropy_fwd(logits, labels):
  lse, lse_vjp = jax.vjp(lambda x: jax.nn.logsumexp(x, axis=-1), logits)
  return lse - label_logits(logits, labels), (lse_vjp, logits, labels)


def _cross_entropy_bwd(residuals, g):
  """softmax * g, rounded, then -g at the label, as optax's separate scatter kernel computes it."""
  # Left alone, XLA fuses the two into one FMA (1 ulp off optax at the label); the select on NaN
  # keeps the product rounded (reduce_precision and optimization_barrier do not survive XLA).
  lse_vjp, logits, labels = residuals
  (term,) = lse_vjp(g)
  term = jnp.where(jnp.isnan(term), jnp.full_like(term, jnp.nan), term)
  _, pick_vjp = jax.vjp(lambda x: label_logits(x, labels), logits)
  (picked,) = pick_vjp(g)
  return term - picked, None


softmax_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def loss_and_correct(logits, labels, task):
  """Per-example (loss, number correct as a fraction) in float32."""
  logits = logits.astype(jnp.float32)
  if task == 'multilabel':
    labels = labels.astype(jnp.float32)
    loss = optax.sigmoid_binary_cross_entropy(logits, labels).mean(axis=-1)
    correct = ((logits > 0) == (labels > 0.5)).astype(jnp.float32).mean(axis=-1)
  else:
    loss = softmax_cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, correct


def create_train_state(model, tx):
  """The state pytree of a freshly built nnx model and an optax optimizer."""
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {
    'params': params,
    'batch_stats': nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)),
    'opt_state': jax.jit(tx.init)(params),  # one program, not an eager zeros_like per leaf
    'step': jnp.zeros((), jnp.int32),
    'sums': jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), run.ZERO_SUMS),
  }


def train_step(state, batch, seed, *, graphdef, tx, mask, task, mean, std, flip):
  """One optimizer step on the global batch; the epoch's sums updated on device."""
  flip_key = jax.random.fold_in(jax.random.key(seed), state['step']) if flip else None
  images = preprocess(batch['image'], mean, std, flip_key)

  def loss_fn(params):
    model = nnx.merge(graphdef, params, state['batch_stats'])
    model.train()
    logits = model(images)
    loss, correct = loss_and_correct(logits, batch['label'], task)
    return loss.mean(), (correct, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))

  with ops.noise_scope(ops.step_noise_key(seed, state['step'], 'train')):
    (loss, (correct, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state['params']
    )
  params, opt_state = run.masked_update(state['params'], grads, state['opt_state'], tx, mask)
  n = jnp.asarray(correct.shape[0], jnp.float32)
  batch_sums = {'loss': loss * n, 'correct': correct.sum(), 'count': n}
  sums = jax.tree.map(operator.add, state['sums'], batch_sums)
  step = state['step'] + 1
  return dict(params=params, batch_stats=batch_stats, opt_state=opt_state, step=step, sums=sums)


def eval_logits(graphdef, state, seed, images, mean, std):
  """Eval-mode logits of uint8 `images` in the noise of (seed, the state's step, 'eval')."""
  model = nnx.merge(graphdef, state['params'], state['batch_stats'])
  model.eval()
  with ops.noise_scope(ops.step_noise_key(seed, state['step'], 'eval')):
    return model(preprocess(images, mean, std))


def eval_step(state, batch, totals, seed, *, graphdef, task, mean, std):
  """Masked sums over a padded batch (every example counts once) and its per-example outputs."""
  logits = eval_logits(graphdef, state, seed, batch['image'], mean, std)
  loss, correct = loss_and_correct(logits, batch['label'], task)
  mask = batch['mask']
  batch_sums = {'loss': (loss * mask).sum(), 'correct': (correct * mask).sum(), 'count': mask.sum()}
  totals = jax.tree.map(operator.add, totals, batch_sums)
  # Per example: the predicted class and the softmax probability of it and of the label
  # (multilabel: each label's predicted bit and sigmoid probability).
  logits = logits.astype(jnp.float32)
  if task == 'multilabel':
    return totals, {
      'predicted': (logits > 0).astype(jnp.int8),
      'probability': jax.nn.sigmoid(logits),
    }
  predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  probs = jax.nn.softmax(logits, axis=-1)
  return totals, {
    'predicted': predicted,
    'p_predicted': label_logits(probs, predicted),
    'p_label': label_logits(probs, batch['label']),
  }


def all_finite(bad, state):
  """[first non-finite step, what] kept on device: what 1 = the training loss, 2 = the state."""
  loss_ok = jnp.isfinite(state['sums']['loss'])
  leaves = jax.tree.leaves((state['params'], state['batch_stats']))
  state_ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
  what = (~loss_ok).astype(jnp.int32) + 2 * (~state_ok).astype(jnp.int32)
  first = (bad[0] < 0) & (what > 0)
  return jnp.where(first, jnp.stack([state['step'].astype(jnp.int32), what]), bad)


def make_train_step(mesh, graphdef, tx, mask, task, mean, std, flip, seed, config=None):
  """jit(state, batch) -> state: the state replicated and donated, the batch sharded, the seed
  bound; with `config`, under its matmul precision."""
  replicated, sharded = run.shardings(mesh)
  fn = functools.partial(
    train_step,
    graphdef=graphdef,
    tx=tx,
    mask=mask,
    task=task,
    mean=jnp.asarray(mean),
    std=jnp.asarray(std),
    flip=flip,
  )
  return run.jit_step(fn, mesh, seed, (replicated, sharded), replicated, (0,), config)


def make_eval_step(mesh, graphdef, task, mean, std, seed, config=None):
  """jit(state, batch, totals) -> (totals, outputs), the outputs replicated to every process."""
  replicated, sharded = run.shardings(mesh)
  fn = functools.partial(
    eval_step, graphdef=graphdef, task=task, mean=jnp.asarray(mean), std=jnp.asarray(std)
  )
  ins = (replicated, sharded, replicated)
  return run.jit_step(fn, mesh, seed, ins, (replicated, replicated), (2,), config)


def initial_state(ctx, model):
  """The training state of `model` with the first phase's optimizer, replicated on the mesh."""
  return run.replicate(ctx, create_train_state(model, run.optimizer(ctx, ctx.phases[0])))


def abstract_state(ctx):
  """`initial_state`'s shapes, dtypes and sharding, without initialising a weight."""

  def state():
    model = run.create_model(ctx.config, ctx.dataset, jax.random.key(0))
    return create_train_state(model, run.optimizer(ctx, ctx.phases[0]))

  return run.replicate(ctx, jax.eval_shape(state))


def enter_phase(ctx, state, phase, step):
  """(state, jitted train step) of `phase` entered at `step`; a later phase's start under
  'per_phase' gets a fresh optimizer state (the reference's new AdamW at the unfreeze)."""
  config = ctx.config
  tx = run.optimizer(ctx, phase)
  if step == phase.start > 0 and config.optim.schedule == 'per_phase':
    init = jax.eval_shape if run.is_abstract(state) else lambda fn, x: jax.jit(fn)(x)
    state = {**state, 'opt_state': run.replicate(ctx, init(tx.init, state['params']))}
  mask = run.trainable_mask(
    state['params'], phase.frozen, config.model.reinit, ctx.model_module.PARTS
  )
  step_fn = make_train_step(
    ctx.mesh,
    ctx.graphdef,
    tx,
    mask,
    ctx.dataset.task,
    ctx.mean,
    ctx.std,
    config.data.flip,
    ctx.data_seed,
    config,
  )
  batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  return state, process.precompile(step_fn, checkpoint.abstract(state), batch)


def eval_fn(ctx, state):
  """The jitted evaluation step for states like `state`."""
  task, seed = ctx.dataset.task, ctx.data_seed
  fn = make_eval_step(ctx.mesh, ctx.graphdef, task, ctx.mean, ctx.std, seed, ctx.config)
  batch = run.abstract_batch(ctx, ctx.dataset.test, run.eval_batch(ctx), mask=True)
  return process.precompile(
    fn, checkpoint.abstract(state), batch, checkpoint.abstract(state['sums'])
  )


def evaluate(ctx, step_fn, state):
  """(metrics, predictions) over every test example, the predictions in test-set order."""
  totals = run.zero_sums(ctx.mesh)
  where = (jax.process_index(), jax.process_count())
  host_batches = batching.eval_batches(ctx.dataset.test, run.eval_batch(ctx), *where)
  batches = (batching.to_global(batch, ctx.sharded) for batch in host_batches)
  outputs = []
  for batch in batching.prefetch(batches, ctx.config.data.prefetch):
    totals, batch_outputs = step_fn(state, batch, totals)
    outputs.append(batch_outputs)
  totals, outputs = jax.device_get((totals, outputs))
  scores = {
    'test_accuracy': float(totals['correct'] / totals['count']),
    'test_loss': float(totals['loss'] / totals['count']),
    'test_count': int(totals['count']),
  }
  return scores, record.collect_predictions(ctx.dataset, outputs)


def watch(ctx, state):
  """(jitted non-finite watch, its initial value [-1, 0]), read by the host at sync points only."""
  # Not donated: the loop keeps the last few as markers of its steps in flight (process.InFlight).
  fn = jax.jit(
    all_finite, in_shardings=(ctx.replicated, ctx.replicated), out_shardings=ctx.replicated
  )
  bad = jax.device_put(np.array([-1, 0], np.int32), ctx.replicated)
  return process.precompile(fn, checkpoint.abstract(bad), checkpoint.abstract(state)), bad


def train_and_evaluate(config, workdir, restart=False, allow_layout_change=False):
  """Train and evaluate the resolved `config` in `workdir`; the final results dict."""
  validation.require_resolved(config, 'trainer.train.train_and_evaluate')  # before the workdir
  created = checkpoint.check_workdir(workdir, checkpoint.LOCK_FILES)
  try:
    with metrics.heartbeat(
      f'Loading {config.data.name} and checking it against the config and the devices'
    ):
      ctx = run.build(config)
  except validation.ConfigError:  # refused before anything was written: leave nothing behind
    checkpoint.remove_created(created)
    raise
  is_writer = jax.process_index() == 0
  facts, data = process.execution_facts(), record.data_facts(ctx.dataset)
  with checkpoint.WorkdirLock(workdir, enabled=is_writer):
    mngr = checkpoint.manager(workdir, config.keep_checkpoints)
    try:
      mngr = checkpoint.check_workdir_run(
        mngr, workdir, config, restart, data, facts, allow_layout_change
      )
      with metrics.heartbeat(
        'Initialising the model (compiled once) and looking for a checkpoint to resume from'
      ):
        mngr, progress, completed = _start(ctx, workdir, mngr)
      results = completed if progress is None else _train(ctx, workdir, mngr, progress, is_writer)
    except BaseException:
      checkpoint.close(mngr, quiet=True)  # the error on its way out says what went wrong
      raise
    checkpoint.close(mngr)
  return results


@dataclasses.dataclass
class Progress:
  """The loop's mutable state: training state, record, what was last logged and saved, reporters."""

  state: Any
  results: dict
  step: int
  last_logged: dict
  last_finite: int
  elapsed_before: float
  saved: int = -1  # the step of the newest checkpoint written (or restored), -1 none
  start_time: float = dataclasses.field(default_factory=time.time)
  predictions: Any = None  # the last evaluation's, until the checkpoint of its step holds them
  writers: Any = None  # metrics.create_writers
  clock: Any = None  # metrics.ProgressClock

  def wall_time(self):
    return self.elapsed_before + time.time() - self.start_time


def _floats(sums):
  return {k: np.float32(v) for k, v in sums.items()}


def _start(ctx, workdir, mngr):
  """(mngr, Progress, saved results of a completed run or None): fresh or resumed."""
  config = ctx.config
  model, model_facts = run.init_model(ctx)
  state = initial_state(ctx, model)
  with numerics_setup.precision_scope(config):
    numerics = numerics_setup.describe(config)
  facts = process.execution_facts()
  results = record.new_record(
    config, facts, numerics, record.data_facts(ctx.dataset), model_facts, process.versions()
  )
  mngr, step, restored, saved = checkpoint.resume(
    mngr, workdir, checkpoint.abstract(state), config.keep_checkpoints
  )
  rules.start_segment(results, saved, facts, step or 0)
  if step is None:
    return mngr, Progress(state, results, 0, _floats(run.ZERO_SUMS), 0, 0.0), None
  results.update(history=saved.get('history', []), wall_time_s=saved.get('wall_time_s', 0.0))
  if saved.get('status') == 'completed' and step == ctx.total_steps:
    logging.info('%s already holds a completed run; nothing to do', workdir)
    return mngr, None, saved
  logging.info('Resumed from %s at step %d', record.checkpoint_dir(workdir), step)
  sums = _floats(saved.get('log_sums', run.ZERO_SUMS))
  progress = Progress(restored, results, step, sums, step, results['wall_time_s'], saved=step)
  return mngr, progress, None


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
  p.clock = metrics.ProgressClock(ctx.total_steps, p.step)
  with metrics.heartbeat('Opening metrics.jsonl and TensorBoard, building the evaluation step'):
    p.writers = metrics.create_writers(workdir, is_writer, p.step, p.results['history'])
    evaluation = eval_fn(ctx, p.state)
    watch_fn, bad = watch(ctx, p.state)
    device_feed = run.feed(ctx)
  if device_feed is not None:
    logging.info(
      'Training split on every device: %.2f GiB each', batching.nbytes(ctx.dataset.train) / 2**30
    )
  p.clock.compiles_ahead(len([f for f in ctx.phases if p.step < f.stop]))
  in_flight = process.InFlight(process.STEPS_IN_FLIGHT)
  with process.StopRequests(p.saved if p.saved > 0 else None) as stops:
    for phase in ctx.phases:
      if p.step >= phase.stop:
        continue
      p.state, step_fn = enter_phase(ctx, p.state, phase, p.step)
      frozen = ' (backbone frozen)' if phase.frozen else ''
      logging.info('Phase %s: steps %d-%d%s', phase.name, phase.start, phase.stop, frozen)
      entered = p.step
      for batch in run.batches(ctx, p.step, phase.stop, device_feed):
        # Before step p.step + 1: on a signal every process agrees on, save step p.step and stop.
        signum = stops.agreed(run.due(ctx, p.step).check)
        if signum:
          logging.warning(
            '%s: stopping after step %d; its checkpoint is being written (a second signal stops '
            'at once)',
            signal.Signals(signum).name,
            p.step,
          )
          if p.saved != p.step:
            _ensure_finite(ctx, mngr, p, bad)
            with p.clock.paused():
              _checkpoint(ctx, mngr, p)
          checkpoint.wait(mngr, p.step)
          mngr.reload()  # the exit skips Python's shutdown: the step's finished folder verified
          if p.step not in mngr.all_steps():
            raise checkpoint.CheckpointWriteError(
              f'the checkpoint of step {p.step} is not in {mngr.directory}'
            )
          p.writers.close()
          raise process.Stopped(signum, p.step)
        compiling = f'Compiling the training step of phase {phase.name} (once)'
        with metrics.heartbeat(compiling) if p.step == entered else contextlib.nullcontext():
          p.state = step_fn(p.state, batch)  # the first call compiles (seconds to minutes)
        bad = watch_fn(bad, p.state)
        p.step += 1
        in_flight.dispatched(bad)  # the host stays at most STEPS_IN_FLIGHT steps ahead
        if p.step == entered + 1:
          p.clock.compiled(entered)  # the phase's first call compiled its step function
          stops.started()  # a signal now saves this session's steps (before it: exits at once)
        _after_step(ctx, mngr, p, bad, evaluation)
    checkpoint.wait(mngr, p.step)  # a signal now changes nothing: the run is complete
  p.writers.close()
  final = metrics.percent(p.results['final']['test_accuracy'])
  logging.info('Done: test_accuracy %s, %s', final, session_times(p))
  return p.results


def session_times(p):
  """'12.3 s' for a run trained in one session; 'this session 12.3 s, all sessions 157.7 s'."""
  if not p.elapsed_before:
    return f'{p.wall_time():.1f} s'
  return f'this session {time.time() - p.start_time:.1f} s, all sessions {p.wall_time():.1f} s'


def _after_step(ctx, mngr, p, bad, evaluation):
  """Whatever is due after step `p.step`: non-finite check, log, epoch end, checkpoint."""
  now = run.due(ctx, p.step)
  if now.check:
    _ensure_finite(ctx, mngr, p, bad)
  if now.log:  # the training loss and accuracy since the last log: console, jsonl, TensorBoard
    config, step = ctx.config, p.step
    sums = jax.device_get(p.state['sums'])
    images_per_sec, eta = p.clock.throughput(step, config.batch_size)
    count = max(sums['count'] - p.last_logged['count'], 1.0)
    loss = (sums['loss'] - p.last_logged['loss']) / count
    accuracy = (sums['correct'] - p.last_logged['correct']) / count
    p.last_logged = sums
    entry = {
      'kind': 'train',
      'step': step,
      'epoch': (step - 1) // ctx.per_epoch + 1,
      'train_loss': float(loss),
      'train_accuracy': float(accuracy),
      'learning_rate': run.learning_rate(config, ctx.per_epoch, ctx.phases, step - 1),
      'images_per_sec': images_per_sec,
    }
    metrics.console_line(entry, eta, ctx.total_steps, config.num_epochs, p.clock.ahead)
    p.writers.write_scalars(step, entry)
  if now.epoch:
    _end_epoch(ctx, p, evaluation, now.evaluate)
  if now.save:
    with p.clock.paused():  # not training time (images/s)
      _checkpoint(ctx, mngr, p, 'completed' if p.step == ctx.total_steps else 'running')


def _checkpoint(ctx, mngr, p, status='running'):
  log_sums = {k: float(v) for k, v in p.last_logged.items()}
  p.results.update(status=status, step=p.step, total_steps=ctx.total_steps, log_sums=log_sums)
  p.results['wall_time_s'] = p.wall_time()
  rules.end_segment(p.results, p.step)
  checkpoint.save(mngr, p.step, p.results, p.state, p.predictions)
  p.predictions = None
  p.last_finite = p.saved = p.step


def _ensure_finite(ctx, mngr, p, bad):
  """At sync points only: stop the run if any step so far produced a non-finite value."""
  bad_step, what = (int(v) for v in jax.device_get(bad))
  if bad_step < 0:
    return
  parts = [name for bit, name in ((1, 'training loss'), (2, 'parameters/gradients')) if what & bit]
  reason = (
    f'non-finite {" and ".join(parts)} at step {bad_step} (epoch '
    f'{(bad_step - 1) // ctx.per_epoch + 1}); the last finite state is checkpoint step '
    f'{p.last_finite}'
  )
  p.results.update(status='failed', reason=reason, failed_step=bad_step, step=p.step)
  p.results.update(total_steps=ctx.total_steps, wall_time_s=p.wall_time())
  p.results.pop('state_digest', None)  # this step saves no state
  checkpoint.save(mngr, p.step, p.results)  # results only: the state is not finite
  checkpoint.wait(mngr, p.step)
  p.writers.close()
  raise TrainingFailed(reason)


def _end_epoch(ctx, p, evaluation, evaluate_now):
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
    first = p.clock.first_evaluation  # it compiles the evaluation step first
    beat = metrics.heartbeat('Compiling the evaluation step and evaluating')
    with p.clock.paused(), beat if first else contextlib.nullcontext():
      scores, p.predictions = evaluate(ctx, evaluation, p.state)
      entry.update(scores)
    p.clock.evaluated(p.step)
    logging.info(
      'epoch %d: test_accuracy %s test_loss %.4f train_loss %.4f',
      epoch,
      metrics.percent(entry['test_accuracy']),
      entry['test_loss'],
      entry['train_loss'],
    )
  entry['wall_time_s'] = p.wall_time()
  p.writers.write_scalars(entry['step'], entry)
  p.results['history'].append({k: v for k, v in entry.items() if k != 'kind'})
  p.state['sums'] = run.zero_sums(ctx.mesh)
  p.last_logged = _floats(run.ZERO_SUMS)
  if p.step == ctx.total_steps:
    p.results['final'] = record.final_metrics(p.results['history'])
