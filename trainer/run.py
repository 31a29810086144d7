"""The run context: everything a training run is built from, built one way for every driver.

  config = validation.resolve(loader.load(spec, overrides))   # configs/: the entry point, once
  numerics_setup.configure(config)   # then, before any JAX backend starts (train.py does both)
  ctx = run.build(config)            # checked against devices and data; dataset, mesh, phases
  model, facts = run.init_model(ctx) # initial weights from init_seed (and model.init_from)
  state = run.initial_state(ctx, model)
  for phase in ctx.phases:
    state, step_fn = run.enter_phase(ctx, state, phase, step)
    for batch in run.batches(ctx, step, phase.stop, feed): state = step_fn(state, batch)

The training loop, the divergence tool and the step benchmarks drive training through these
functions only: the phases, the per-phase optimizer reset, the sharding and the numerics of every
jitted step (traced under the config's matmul precision, for the mesh's platform) are decided
here. See docs/numerics.md and docs/operations.md ("A training run").
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from configs import capacity, common, validation
from input_pipeline import base, batching, registry
from models import resnet
from numerics import setup as numerics_setup
from runrecord import predictions
from trainer import checkpointing, distributed, optim, platforms, steps


@dataclasses.dataclass(frozen=True)
class Context:
  """What a run is built from; every field derives from `config` (and the devices)."""

  config: ml_collections.ConfigDict  # resolved (configs/validation.py resolve)
  dataset: base.Dataset  # loaded, or declared without its data (registry.declared)
  mesh: Mesh  # 1-D, axis 'data'
  replicated: NamedSharding  # of the state
  sharded: NamedSharding  # of a batch (along 'data')
  per_epoch: int  # steps per epoch
  total_steps: int
  phases: list[optim.Phase]  # in order, covering [0, total_steps)
  mean: np.ndarray  # float32 [channels]: the normalisation (base.normalization_constants)
  std: np.ndarray
  graphdef: nnx.GraphDef  # the model's structure (its state comes from init_model)


# A training state: {'params', 'batch_stats', 'opt_state', 'step', ...} (trainer/steps.py
# init_state), of arrays or, built by `abstract_state`, of ShapeDtypeStructs.
State = dict[str, Any]


def load_dataset(config: ml_collections.ConfigDict) -> base.Dataset:
  """The dataset config.data names, loaded by its module (input_pipeline/registry.py); what its
  loader refuses (missing files, a bad folder) as a one-line ConfigError."""
  try:
    return registry.load(config)
  except (FileNotFoundError, ValueError) as e:
    raise validation.ConfigError(str(e).splitlines()[0]) from None


def build(
  config: ml_collections.ConfigDict,
  dataset: base.Dataset | None = None,
  devices: Sequence[jax.Device] | None = None,
  device_bytes: int | None = None,
) -> Context:
  """The run's context from a resolved config; the one place that checks the config against the
  devices and the data (configs/capacity.py check_devices, then check_dataset), before any
  compute.

  Args:
    config: the resolved config (configs/validation.py resolve), its XLA flags applied to this
      process (numerics/setup.py configure).
    dataset: reuse one already loaded (arms of one comparison), or one declared without its data
      (input_pipeline/registry.py declared); None: load config.data's.
    devices: the mesh's devices (default: all of them), also compile-only ones (a TPU topology,
      sweeps/preflight.py): the batch must split over them and their processes.
    device_bytes: one device's memory where the devices do not report it (a TPU chip's HBM).
  Returns:
    The Context.
  Raises:
    ConfigError: the batch does not split over the devices, the activations or a device-resident
      split do not fit, the split gives no full batch; or the data cannot be loaded.
    TypeError: the config was not resolved. ValueError: its XLA flags are not applied.
  """
  validation.require_resolved(config, 'trainer.run.build')
  numerics_setup.require_configured(config)
  devices = list(devices if devices is not None else jax.devices())
  processes = len({d.process_index for d in devices})
  device_bytes = device_bytes or platforms.device_memory(jax.local_devices())
  capacity.check_devices(config, len(devices), processes, device_bytes)  # before a long load
  dataset = load_dataset(config) if dataset is None else dataset
  capacity.check_dataset(config, len(dataset.train), batching.nbytes(dataset.train), device_bytes)
  mesh = steps.make_mesh(devices)
  replicated, sharded = steps.shardings(mesh)
  per_epoch = batching.steps_per_epoch(len(dataset.train), config.batch_size)
  mean, std = base.normalization_constants(config.data.normalization, dataset.image_shape[-1])
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: _create(config, dataset, jax.random.key(0))))
  return Context(
    config,
    dataset,
    mesh,
    replicated,
    sharded,
    per_epoch,
    config.num_epochs * per_epoch,
    optim.phases(config, per_epoch),
    mean,
    std,
    graphdef,
  )


def platform(ctx: Context) -> str:
  """The platform of the mesh's devices ('cpu', 'gpu', 'tpu'): what every step is traced for."""
  return ctx.mesh.devices.flat[0].platform


def _traced(ctx):
  """How every jitted step is traced: under the config's matmul precision, for the mesh's
  platform (numerics/setup.py with_precision)."""
  return lambda fn: numerics_setup.with_precision(fn, ctx.config, platform(ctx))


def _create(config, dataset, key):
  return resnet.create_model(
    config, dataset.num_classes, dataset.image_shape[-1], nnx.Rngs(params=key)
  )


def param_shapes(ctx):
  """The model's parameters as ShapeDtypeStructs (pure dict), without initialising them."""
  abstract = nnx.eval_shape(lambda: _create(ctx.config, ctx.dataset, jax.random.key(0)))
  return nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


def init_model(ctx: Context) -> tuple[nnx.Module, dict[str, Any]]:
  """(model, facts): the initial model from the init seed (configs/common.py `init_seed_of`:
  config.init_seed, else config.seed) and `model.init_from`, when given.

  The initial weights are computed on the host CPU backend, as one jitted computation compiled
  without backend optimisations (seconds on a small CPU, and no fused arithmetic), so a seed gives
  the same initial weights on TPU, GPU and CPU: runs pair across platforms by seed. The key is an
  argument, so runs that differ only in seed share one compiled init.

  Returns:
    (model, facts): the nnx model, not yet on the mesh; facts {} or, with model.init_from, what
    models/pretrained.py load_into says (file, sha256, keys loaded, parts re-initialised).
  Raises:
    ConfigError: model.init_from cannot be read or does not fit the model (one line).
  """
  config = ctx.config
  try:
    host = jax.local_devices(backend='cpu')[0]
  except RuntimeError:  # JAX_PLATFORMS excludes the CPU backend: initialise on the default device
    host = jax.local_devices()[0]
  key = jax.device_put(jax.random.key(common.init_seed_of(config)), host)
  with jax.default_device(host):
    init = (
      jax.jit(lambda k: nnx.state(_create(config, ctx.dataset, k)))
      .lower(key)
      .compile({'xla_backend_optimization_level': 0})  # type: ignore[dict-item]  # XLA takes ints
    )
    # Fetched to the host and re-made uncommitted, so every process can place them on the global
    # mesh (a committed CPU array cannot move to another host's devices).
    model = nnx.merge(ctx.graphdef, jax.tree.map(jnp.asarray, jax.device_get(init(key))))
  facts = {}
  if config.model.init_from:
    from models import pretrained

    try:
      facts = pretrained.load_into(model, config.model.init_from, tuple(config.model.reinit))
    except (OSError, ValueError) as e:  # one line naming config.model.init_from, the file, the fix
      raise validation.ConfigError(str(e).splitlines()[0]) from None
  return model, facts


def optimizer(ctx: Context, phase: optim.Phase) -> optax.GradientTransformation:
  return optim.make_optimizer(ctx.config, ctx.per_epoch, phase)


def initial_state(ctx: Context, model: nnx.Module) -> State:
  """The training state of `model` with the first phase's optimizer, replicated on the mesh."""
  return replicate(ctx, steps.init_state(model, optimizer(ctx, ctx.phases[0])))


def abstract_state(ctx: Context) -> State:
  """`initial_state`'s shapes, dtypes and sharding (ShapeDtypeStructs), without initialising any
  weight: what a step is lowered and compiled for on devices that hold no data."""
  return replicate(
    ctx,
    jax.eval_shape(
      lambda: steps.init_state(
        _create(ctx.config, ctx.dataset, jax.random.key(0)), optimizer(ctx, ctx.phases[0])
      )
    ),
  )


def is_abstract(tree):
  """Whether every leaf of `tree` is a ShapeDtypeStruct (a state built by `abstract_state`)."""
  return all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(tree))


def replicate(ctx, tree):
  """`tree` replicated on the mesh: its arrays placed there, or, for an abstract tree, its
  ShapeDtypeStructs given the replicated sharding (the one path for both builds)."""
  if is_abstract(tree):
    return jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(
        s.shape, s.dtype, sharding=ctx.replicated, weak_type=s.weak_type
      ),
      tree,
    )
  return jax.device_put(tree, ctx.replicated)


def abstract_batch(ctx, split, batch_size, mask=False):
  """ShapeDtypeStructs of a global batch of `split`, for compiling ahead (several processes)."""

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=ctx.sharded)

  out = {
    'image': spec((batch_size,) + split.images.shape[1:], split.images.dtype),
    'label': spec((batch_size,) + split.labels.shape[1:], split.labels.dtype),
  }
  if mask:
    out['mask'] = spec((batch_size,), np.float32)
  return out


def enter_phase(
  ctx: Context, state: State, phase: optim.Phase, step: int
) -> tuple[State, Callable[..., State]]:
  """(state, jitted train step) for `phase`, entered at global `step`.

  At the start of a later phase with `optim.schedule='per_phase'` the optimizer state is made
  afresh (the reference's new AdamW at the unfreeze); a run resumed inside a phase keeps its own.

  Args:
    state: the training state (arrays, or ShapeDtypeStructs from `abstract_state` to lower and
      compile only).
    phase, step: the optim.Phase and the global step it is entered at (its start, or a resume's).
  Returns:
    (state, step_fn): the state, its optimizer state fresh where the schedule says so, and
    step_fn(state, batch) -> state, the jitted step with the phase's optimizer, trainable mask,
    the run's data seed and numerics (precompiled with several processes).
  """
  config = ctx.config
  tx = optimizer(ctx, phase)
  if step == phase.start > 0 and config.optim.schedule == 'per_phase':
    init = jax.eval_shape if is_abstract(state) else lambda fn, x: fn(x)
    state = {**state, 'opt_state': replicate(ctx, init(tx.init, state['params']))}
  mask = optim.trainable_mask(state['params'], phase.frozen, config.model.reinit)
  step_fn = steps.make_train_step(
    ctx.mesh,
    ctx.graphdef,
    tx,
    mask,
    ctx.dataset.task,
    ctx.mean,
    ctx.std,
    config.data.flip,
    common.data_seed_of(config),
    wrap=_traced(ctx),
  )
  if jax.process_count() > 1:
    step_fn = distributed.precompile(
      step_fn,
      checkpointing.abstract(state),
      abstract_batch(ctx, ctx.dataset.train, config.batch_size),
    )
  return state, step_fn


def eval_batch(ctx):
  """The global evaluation batch: config.eval_batch_size at most, no larger than the test split
  needs (batching.eval_batch_size, a multiple of the mesh's devices)."""
  return batching.eval_batch_size(
    len(ctx.dataset.test), ctx.config.eval_batch_size, ctx.mesh.devices.size
  )


def eval_step(ctx, state):
  """The jitted evaluation step (masked sums over a padded batch) for states like `state`."""
  fn = steps.make_eval_step(
    ctx.mesh,
    ctx.graphdef,
    ctx.dataset.task,
    ctx.mean,
    ctx.std,
    common.data_seed_of(ctx.config),
    wrap=_traced(ctx),
  )
  if jax.process_count() > 1:
    batch = abstract_batch(ctx, ctx.dataset.test, eval_batch(ctx), mask=True)
    fn = distributed.precompile(
      fn, checkpointing.abstract(state), batch, checkpointing.abstract(state['sums'])
    )
  return fn


def evaluate(ctx, step_fn, state):
  """(metrics, predictions): top-1 accuracy (or mean per-label accuracy) and loss over every
  example of the test split, and its per-example predictions in test-set order
  (runrecord/predictions.py), fetched from the devices once, at the end.

  Batches are gathered and put on the devices `data.prefetch` ahead on a thread, as in training.
  """
  config = ctx.config
  totals = jax.device_put(
    jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), steps.ZERO_SUMS), ctx.replicated
  )
  batches = (
    batching.to_global(batch, ctx.sharded)
    for batch in batching.eval_batches(
      ctx.dataset.test, eval_batch(ctx), jax.process_index(), jax.process_count()
    )
  )
  outputs = []
  for batch in batching.prefetch(batches, config.data.prefetch):
    totals, batch_outputs = step_fn(state, batch, totals)
    outputs.append(batch_outputs)
  totals, outputs = jax.device_get((totals, outputs))
  metrics = {
    'test_accuracy': float(totals['correct'] / totals['count']),
    'test_loss': float(totals['loss'] / totals['count']),
    'test_count': int(totals['count']),
  }
  return metrics, predictions.collect(ctx.dataset, outputs)


def watch(ctx, state):
  """(jitted non-finite watch, its initial value): see steps.make_watch."""
  fn, bad = steps.make_watch(ctx.mesh), steps.no_bad_step(ctx.mesh)
  if jax.process_count() > 1:
    fn = distributed.precompile(fn, checkpointing.abstract(bad), checkpointing.abstract(state))
  return fn, bad


def feed(ctx, on_device=None):
  """None (host feeding) or (device-resident training split, jitted gather): as data.on_device
  says, unless `on_device` is given (a benchmark comparing both feeds of one run)."""
  if not (ctx.config.data.on_device if on_device is None else on_device):
    return None
  data, gather = batching.on_devices(ctx.dataset.train, ctx.replicated), steps.make_gather(ctx.mesh)
  if jax.process_count() > 1:
    gather = distributed.precompile(
      gather,
      checkpointing.abstract(data),
      jax.ShapeDtypeStruct((ctx.config.batch_size,), np.int32, sharding=ctx.sharded),
    )
  return data, gather


def batches(ctx, start, stop, device_feed=None):
  """Training batches of global steps [start, stop), sharded, prefetched (the data order is a
  function of the data seed, `configs.common.data_seed_of`, and the step alone)."""
  c = ctx.config
  return batching.train_batches(
    ctx.dataset.train,
    c.batch_size,
    common.data_seed_of(c),
    start,
    stop,
    ctx.sharded,
    c.data.prefetch,
    device_feed,
  )
