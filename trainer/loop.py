"""train_and_evaluate(config, workdir): the whole run, from config to Orbax results.

Order of work: validate everything (config, devices, workdir, dataset) before compiling; build or
restore the state; train phase by phase with on-device metric sums; evaluate every
`eval_every_epochs`; checkpoint every epoch (and every `checkpoint_every_steps`); write results.
Restarting the same command on the same workdir resumes from the newest checkpoint that restores
(trainer/resume.py) and reproduces the uninterrupted run bit for bit: data order, augmentation and
schedule are functions of the global step, and the state carries the epoch's metric sums (the
results carry the sums at the last log, so even the logged metrics match). The workdir is locked
while a run holds it (trainer/lock.py). Non-finite values are tracked on device
(`steps.make_watch`: one small jitted reduction per step, no host sync) and checked at
log/epoch/checkpoint points: the run stops with TrainingFailed naming the first bad step, its
results say status 'failed', and no checkpoint ever holds a non-finite state.
"""

import importlib.metadata
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

import input_pipeline
from input_pipeline import base, batching
from models import resnet
from numerics import setup as numerics_setup
from trainer import checkpointing, distributed, faults, lock, optim, reporting, resume, steps, validation

VERSIONED_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy')


def versions():
  out = {}
  for name in VERSIONED_PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def prepare(config, workdir):
  """Every check that can fail on bad input, before compute. Returns the dataset."""
  validation.check_config(config)
  validation.check_devices(config, jax.device_count(), jax.process_count())
  validation.check_workdir(workdir)
  try:
    dataset = input_pipeline.get_dataset(config)
  except (FileNotFoundError, ValueError) as e:
    raise validation.ConfigError(str(e).splitlines()[0]) from None
  validation.check_dataset(config, dataset, validation.device_memory(jax.local_devices()))
  return dataset


def build_model(config, dataset):
  """The model, initialised from `config.seed` (and `model.init_from`, when given).

  The initial weights are computed on the host CPU backend, as one jitted computation compiled
  without backend optimisations (4 s instead of 30 s on a small CPU, and no fused arithmetic), so a
  seed gives the same initial weights on TPU, GPU and CPU: runs pair across platforms by seed. The
  key is an argument, so runs that differ only in seed share one compiled init.
  """
  def create(key):
    return resnet.create_model(config, dataset.num_classes, dataset.image_shape[-1],
                               nnx.Rngs(params=key))

  try:
    host = jax.local_devices(backend='cpu')[0]
  except RuntimeError:  # JAX_PLATFORMS excludes the CPU backend: initialise on the default device
    host = jax.local_devices()[0]
  key = jax.device_put(jax.random.key(config.seed), host)
  graphdef, _ = nnx.split(nnx.eval_shape(create, key))
  with jax.default_device(host):
    init = jax.jit(lambda k: nnx.state(create(k))).lower(key).compile(
        {'xla_backend_optimization_level': 0})
    # Fetched to the host and re-made uncommitted, so every process can place them on the global
    # mesh (a committed CPU array cannot move to another host's devices).
    model = nnx.merge(graphdef, jax.tree.map(jnp.asarray, jax.device_get(init(key))))
  facts = {}
  if config.model.init_from:
    from models import pretrained
    facts = pretrained.load_into(model, config.model.init_from, tuple(config.model.reinit))
  return model, facts


def evaluate(eval_step, state, split, config, sharding, epoch=0):
  """Top-1 accuracy (or mean per-label accuracy) and loss over every example of `split`.

  Batches are gathered and put on the devices `data.prefetch` ahead on a thread, as in training,
  so the devices do not wait for the host between evaluation batches.
  """
  totals = jax.device_put(jax.tree.map(lambda v: jnp.asarray(v, jnp.float32),
                                       steps.ZERO_SUMS), sharding[0])
  batches = (batching.to_global(batch, sharding[1]) for batch in batching.eval_batches(
      split, config.eval_batch_size, jax.process_index(), jax.process_count()))
  for batch in batching.prefetch(batches, config.data.prefetch):
    totals = eval_step(state, batch, totals)
    faults.point('eval', epoch)
  totals = jax.device_get(totals)
  return {'test_accuracy': float(totals['correct'] / totals['count']),
          'test_loss': float(totals['loss'] / totals['count']), 'test_count': int(totals['count'])}


def base_results(config, dataset, model_facts):
  device = jax.devices()[0]
  return {
      'status': 'running', 'reason': '', 'seed': int(config.seed),
      'platform': device.platform, 'device_kind': device.device_kind,
      'num_devices': jax.device_count(), 'num_processes': jax.process_count(),
      'numerics': numerics_setup.describe(config), 'data': dict(dataset.info),
      'model': model_facts, 'config': config.to_dict(), 'versions': versions(),
      'final': {}, 'history': [], 'wall_time_s': 0.0,
  }


def final_metrics(history):
  """The run's headline numbers: the last evaluation and the last epoch's training metrics."""
  evaluated = [h for h in history if 'test_accuracy' in h]
  last = history[-1]
  return {'test_accuracy': evaluated[-1]['test_accuracy'], 'test_loss': evaluated[-1]['test_loss'],
          'train_loss': last['train_loss'], 'train_accuracy': last['train_accuracy']}


def abstract_batch(split, batch_size, sharding, mask=False):
  """ShapeDtypeStructs of a global batch of `split`, for compiling ahead (several processes)."""
  out = {'image': jax.ShapeDtypeStruct((batch_size,) + split.images.shape[1:], split.images.dtype,
                                       sharding=sharding),
         'label': jax.ShapeDtypeStruct((batch_size,) + split.labels.shape[1:], split.labels.dtype,
                                       sharding=sharding)}
  if mask:
    out['mask'] = jax.ShapeDtypeStruct((batch_size,), np.float32, sharding=sharding)
  return out


class TrainingFailed(RuntimeError):
  """The run stopped on a non-finite loss or state; its results record status 'failed'."""


def nonfinite_reason(bad_step, what, per_epoch, last_finite):
  parts = [name for bit, name in ((1, 'training loss'), (2, 'parameters/gradients')) if what & bit]
  return (f'non-finite {" and ".join(parts)} at step {bad_step} (epoch '
          f'{(bad_step - 1) // per_epoch + 1}); the last finite state is checkpoint step '
          f'{last_finite}')


def train_and_evaluate(config, workdir, restart=False):
  """Train and evaluate `config` in `workdir`; returns the final results dict.

  Raises validation.ConfigError on bad input or an unusable workdir (before compute),
  TrainingFailed on a non-finite loss/state, checkpointing.CheckpointWriteError when a checkpoint
  cannot be written.
  """
  validation.check_config(config)
  numerics_setup.configure(config)  # before anything is traced
  dataset = prepare(config, workdir)
  is_writer = jax.process_index() == 0
  with lock.WorkdirLock(workdir, enabled=is_writer):
    mngr = checkpointing.manager(workdir, config.keep_checkpoints)
    try:
      mngr = resume.check_workdir_run(mngr, workdir, config, restart)
      return _train(config, workdir, dataset, mngr, is_writer)
    finally:
      mngr.close()


def _train(config, workdir, dataset, mngr, is_writer):
  start_time = time.time()
  mesh = steps.make_mesh()
  sharding = steps.shardings(mesh)
  per_epoch = batching.steps_per_epoch(len(dataset.train), config.batch_size)
  all_phases = optim.phases(config, per_epoch)
  total_steps = config.num_epochs * per_epoch
  mean, std = base.normalization_constants(config.data.normalization, dataset.image_shape[-1])

  model, model_facts = build_model(config, dataset)
  graphdef = nnx.graphdef(model)
  state = steps.init_state(model, optim.make_optimizer(config, per_epoch, all_phases[0]))
  state = jax.device_put(state, sharding[0])
  results = base_results(config, dataset, model_facts)

  mngr, step, restored, saved = resume.restore(mngr, workdir, checkpointing.abstract(state),
                                               config.keep_checkpoints)
  log_sums = dict(steps.ZERO_SUMS)
  if step is None:
    step = 0
  else:
    state = restored
    results['history'] = saved.get('history', [])
    results['wall_time_s'] = saved.get('wall_time_s', 0.0)
    log_sums = saved.get('log_sums', log_sums)
    if saved.get('status') == 'completed' and step == total_steps:
      logging.info('%s already holds a completed run; nothing to do', workdir)
      return saved
    logging.info('Resumed from %s at step %d', checkpointing.checkpoint_dir(workdir), step)
  elapsed_before = results['wall_time_s']
  last_finite = step

  reporter = reporting.Reporter(workdir, total_steps, is_writer, resume_step=step)
  eval_step = steps.make_eval_step(mesh, graphdef, dataset.task, mean, std)
  watch = steps.make_watch(mesh)
  bad = steps.no_bad_step(mesh)
  if jax.process_count() > 1:
    eval_step = distributed.precompile(
        eval_step, checkpointing.abstract(state),
        abstract_batch(dataset.test, config.eval_batch_size, sharding[1], mask=True),
        checkpointing.abstract(state['sums']))
    watch = distributed.precompile(watch, checkpointing.abstract(bad),
                                   checkpointing.abstract(state))
  on_device = None
  if config.data.on_device:
    device_data, gather = batching.on_devices(dataset.train, sharding[0]), steps.make_gather(mesh)
    if jax.process_count() > 1:
      gather = distributed.precompile(gather, checkpointing.abstract(device_data),
                                      jax.ShapeDtypeStruct((config.batch_size,), np.int32,
                                                           sharding=sharding[1]))
    on_device = (device_data, gather)
    logging.info('Training split on every device: %.2f GiB each',
                 batching.nbytes(dataset.train) / 2**30)
  logging.info('%s: %d train / %d test examples, %d steps/epoch, %d devices, %d processes',
               dataset.name, len(dataset.train), len(dataset.test), per_epoch,
               jax.device_count(), jax.process_count())

  def checkpoint(at_step, status='running'):
    results.update(status=status, step=at_step, total_steps=total_steps,
                   wall_time_s=elapsed_before + time.time() - start_time,
                   log_sums={k: float(v) for k, v in last_logged.items()})
    checkpointing.save(mngr, at_step, state, results)

  def ensure_finite(at_step):
    """At sync points only: stop the run if any step so far produced a non-finite value."""
    bad_step, what = (int(v) for v in jax.device_get(bad))
    if bad_step < 0:
      return
    reason = nonfinite_reason(bad_step, what, per_epoch, last_finite)
    results.update(status='failed', reason=reason, failed_step=bad_step, step=at_step,
                   total_steps=total_steps,
                   wall_time_s=elapsed_before + time.time() - start_time)
    checkpointing.wait(mngr)
    checkpointing.save(mngr, at_step, None, results)  # results only: the state is not finite
    checkpointing.wait(mngr, at_step)
    reporter.close()
    raise TrainingFailed(reason)

  last_logged = {k: np.float32(v) for k, v in log_sums.items()}
  for phase in all_phases:
    if step >= phase.stop:
      continue
    tx = optim.make_optimizer(config, per_epoch, phase)
    if step == phase.start and phase.start > 0 and config.optim.schedule == 'per_phase':
      state['opt_state'] = jax.device_put(tx.init(state['params']), sharding[0])
    mask = optim.trainable_mask(state['params'], phase.frozen, config.model.reinit)
    train_step = steps.make_train_step(mesh, graphdef, tx, mask, dataset.task, mean, std,
                                       config.data.flip, config.seed)
    if jax.process_count() > 1:
      train_step = distributed.precompile(train_step, checkpointing.abstract(state), abstract_batch(
          dataset.train, config.batch_size, sharding[1]))
    logging.info('Phase %s: steps %d-%d%s', phase.name, phase.start, phase.stop,
                 ' (backbone frozen)' if phase.frozen else '')
    for batch in batching.train_batches(dataset.train, config.batch_size, config.seed, step,
                                        phase.stop, sharding[1], config.data.prefetch, on_device):
      state = train_step(state, batch)
      bad = watch(bad, state)
      step += 1
      faults.point('step', step)
      epoch, in_epoch = divmod(step, per_epoch)
      save_now = bool(config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0)
      if step % config.log_every_steps == 0 or in_epoch == 0 or save_now:
        ensure_finite(step)
      if step % config.log_every_steps == 0 or in_epoch == 0:
        sums = jax.device_get(state['sums'])
        count = max(sums['count'] - last_logged['count'], 1.0)
        loss = (sums['loss'] - last_logged['loss']) / count
        accuracy = (sums['correct'] - last_logged['correct']) / count
        last_logged = sums
        lr = optim.learning_rate(config, per_epoch, all_phases, step - 1)
        images_per_sec, eta = reporter.throughput(step, config.batch_size)
        reporter.progress(step, epoch - (in_epoch == 0), config.num_epochs, loss, accuracy, lr,
                          images_per_sec, eta)
        reporter.write({'kind': 'train', 'step': step, 'epoch': epoch - (in_epoch == 0) + 1,
                        'train_loss': float(loss), 'train_accuracy': float(accuracy),
                        'learning_rate': lr, 'images_per_sec': images_per_sec})
      if in_epoch == 0:
        record = {'kind': 'epoch', 'epoch': epoch, 'step': step,
                  'train_loss': float(sums['loss'] / sums['count']),
                  'train_accuracy': float(sums['correct'] / sums['count'])}
        if epoch % config.eval_every_epochs == 0 or epoch == config.num_epochs:
          record.update(evaluate(eval_step, state, dataset.test, config, sharding, epoch))
          logging.info('epoch %d: test_accuracy %.4f test_loss %.4f train_loss %.4f', epoch,
                       record['test_accuracy'], record['test_loss'], record['train_loss'])
        record['wall_time_s'] = elapsed_before + time.time() - start_time
        reporter.write(record)
        results['history'].append({k: v for k, v in record.items() if k != 'kind'})
        state['sums'] = steps.zero_sums(mesh)
        last_logged = {k: np.float32(v) for k, v in steps.ZERO_SUMS.items()}
        if step == total_steps:
          results['final'] = final_metrics(results['history'])
        checkpoint(step, 'completed' if step == total_steps else 'running')
        last_finite = step
      elif save_now:
        checkpoint(step)
        last_finite = step

  checkpointing.wait(mngr, step)
  reporter.close()
  logging.info('Done: test_accuracy %.4f, %.1f s', results['final']['test_accuracy'],
               results['wall_time_s'])
  return results
