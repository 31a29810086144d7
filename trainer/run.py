"""The run context: what a run is built from (data, model, mesh, phases, optimizer, cadence, the
steps' jitting), one way for every driver (the loop, the tools, the TPU preflight)."""

import collections
import dataclasses
import functools
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import input_pipeline
import models
from configs import common, validation
from configs.validation import ConfigError
from input_pipeline import batching
from numerics import setup as numerics_setup
from trainer import checkpoint, process

ZERO_SUMS = {'loss': 0.0, 'correct': 0.0, 'count': 0.0}  # the epoch's training sums, on device


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, stop) trained with `frozen` (backbone fixed) and a schedule over `length`."""

  name: str
  start: int
  stop: int
  frozen: bool
  schedule_start: int  # the optimizer step count at `start` is step - schedule_start
  schedule_length: int


@dataclasses.dataclass(frozen=True)
class Context:
  """What a run is built from; every field derives from `config` (and the devices)."""

  config: ml_collections.ConfigDict  # resolved (configs/validation.py resolve)
  dataset: input_pipeline.Dataset  # loaded, or declared without its data (input_pipeline.declared)
  model_module: ModuleType  # the model's module (models/__init__.py: its contract checked)
  mesh: Mesh  # 1-D, axis 'data'
  replicated: NamedSharding  # of the state
  sharded: NamedSharding  # of a batch (along 'data')
  per_epoch: int  # steps per epoch
  total_steps: int
  phases: list[Phase]  # in order, covering [0, total_steps)
  mean: np.ndarray  # float32 [channels]: the normalisation
  std: np.ndarray
  graphdef: nnx.GraphDef  # the model's structure (its state comes from init_model)
  data_seed: int  # of the data order, flips and product noise (common.data_seed_of)


def load_dataset(config: ml_collections.ConfigDict) -> input_pipeline.Dataset:
  """The dataset config.data names, loaded; what its loader refuses (one line) a ConfigError."""
  try:
    return input_pipeline.load(config)
  except (FileNotFoundError, input_pipeline.DataError) as e:
    raise ConfigError(str(e)) from e


def build(
  config: ml_collections.ConfigDict,
  dataset: input_pipeline.Dataset | None = None,
  devices: Sequence[jax.Device] | None = None,
  device_bytes: int | None = None,
) -> Context:
  """The run's context from a resolved, configured config, checked against the model, devices and
  data (ConfigError); a dataset, the devices and their memory may be given."""
  validation.require_resolved(config, 'trainer.run.build')
  numerics_setup.require_configured(config)
  try:
    module = models.get(config.model.name)  # its contract checked
  except ValueError as e:  # the registry's one line
    raise ConfigError(str(e)) from e
  unknown = [part for part in config.model.reinit if part not in module.PARTS]
  if unknown:
    raise ConfigError(f'config.model.reinit may name {sorted(module.PARTS)}, got {unknown}')
  devices = list(devices if devices is not None else jax.devices())
  processes = len({d.process_index for d in devices})
  device_bytes = device_bytes or process.device_memory(jax.local_devices())
  validation.check_devices(config, len(devices), processes, device_bytes)  # before a long load
  dataset = load_dataset(config) if dataset is None else dataset
  validation.check_dataset(config, len(dataset.train), batching.nbytes(dataset.train), device_bytes)
  mesh = make_mesh(devices)
  replicated, sharded = shardings(mesh)
  per_epoch = batching.steps_per_epoch(len(dataset.train), config.batch_size)
  mean, std = input_pipeline.normalization_constants(
    config.data.normalization, dataset.image_shape[-1]
  )
  platform = mesh.devices.flat[0].platform  # what every step is traced for
  graphdef = nnx.graphdef(
    nnx.eval_shape(lambda: create_model(config, dataset, jax.random.key(0), platform))
  )
  return Context(
    config,
    dataset,
    module,
    mesh,
    replicated,
    sharded,
    per_epoch,
    config.num_epochs * per_epoch,
    phases(config, per_epoch),
    mean,
    std,
    graphdef,
    common.data_seed_of(config),
  )


def create_model(config, dataset, key, platform=None):
  """The model of `config` for `dataset`, its products traced for `platform` (models.build)."""
  channels = dataset.image_shape[-1]
  return models.build(config, dataset.num_classes, channels, nnx.Rngs(params=key), platform)


def param_shapes(ctx):
  """The model's parameters as ShapeDtypeStructs (pure dict), without initialising them."""
  abstract = nnx.eval_shape(lambda: create_model(ctx.config, ctx.dataset, jax.random.key(0)))
  return nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


def init_model(ctx: Context) -> tuple[nnx.Module, dict[str, Any]]:
  """(model, facts): the initial model from the init seed, and from model.init_from where given."""
  # On the host CPU, one jitted computation compiled without backend optimisations (no fused
  # arithmetic): a seed gives the same weights on TPU, GPU and CPU, so runs pair by seed.
  config = ctx.config
  try:
    host = jax.local_devices(backend='cpu')[0]
  except RuntimeError:  # JAX_PLATFORMS excludes the CPU backend: initialise on the default device
    host = jax.local_devices()[0]
  key = jax.device_put(jax.random.key(common.init_seed_of(config)), host)
  with jax.default_device(host):
    init = (
      jax.jit(lambda key: nnx.state(create_model(config, ctx.dataset, key)))
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
      facts = pretrained.load_into(
        model, config.model.init_from, tuple(config.model.reinit), config.model.name
      )
    except (OSError, pretrained.WeightsError) as e:  # one line: the field, the file, the fix
      raise ConfigError(str(e)) from e
  return model, facts


def phases(config: ml_collections.ConfigDict, steps_per_epoch: int) -> list[Phase]:
  """The run's phases: 'frozen' (only the reinit parts train) for optim.freeze_epochs, then
  'full'."""
  total = config.num_epochs * steps_per_epoch
  freeze = config.optim.freeze_epochs * steps_per_epoch
  if config.optim.schedule == 'continuous':
    out = [Phase('frozen', 0, freeze, True, 0, total)] if freeze else []
    return out + [Phase('full', freeze, total, False, 0, total)]
  out = [Phase('frozen', 0, freeze, True, 0, freeze)] if freeze else []
  return out + [Phase('full', freeze, total, False, freeze, total - freeze)]


# What happens after a step (booleans): check non-finite values, log, end the epoch, evaluate, save.
Due = collections.namedtuple('Due', 'check log epoch evaluate save')


def due(ctx, step):
  """What the loop does after `step` steps: the one cadence rule (big_vision's `itstime`)."""
  c = ctx.config
  epoch, in_epoch = divmod(step, ctx.per_epoch)
  epoch_end = in_epoch == 0
  log = step % c.log_every_steps == 0 or epoch_end
  save = bool(c.checkpoint_every_steps and step % c.checkpoint_every_steps == 0)
  evaluate_now = epoch_end and (epoch % c.eval_every_epochs == 0 or epoch == c.num_epochs)
  return Due(
    check=log or save, log=log, epoch=epoch_end, evaluate=evaluate_now, save=save or epoch_end
  )


def phase_at(all_phases: Sequence[Phase], step: int) -> Phase:
  """The phase of `all_phases` holding global `step` (the last one past their end)."""
  for phase in all_phases:
    if phase.start <= step < phase.stop:
      return phase
  return all_phases[-1]


def warmup_cosine(config, steps_per_epoch, length):
  """optax schedule: linear 0 -> lr over warmup, cosine lr -> 0 at `length` steps."""
  warmup = int(round(config.optim.warmup_epochs * steps_per_epoch))
  warmup = max(0, min(warmup, length - 1))
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.optim.learning_rate,
    warmup_steps=warmup,
    decay_steps=max(length, 1),
    end_value=0.0,
  )


def learning_rate(config, steps_per_epoch, all_phases, step):
  """The learning rate of global step `step`, evaluated on the host for the log (not
  optax.inject_hyperparams, which would put it into every checkpoint)."""
  phase = phase_at(all_phases, step)
  schedule = warmup_cosine(config, steps_per_epoch, phase.schedule_length)
  return float(schedule(step - phase.schedule_start))


def make_optimizer(config, steps_per_epoch, phase):
  """AdamW (decoupled weight decay scaled by the lr, as torch.optim.AdamW) for `phase`."""
  o, schedule = config.optim, warmup_cosine(config, steps_per_epoch, phase.schedule_length)
  return optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)


def optimizer(ctx: Context, phase: Phase) -> optax.GradientTransformation:
  return make_optimizer(ctx.config, ctx.per_epoch, phase)


def trainable_mask(params, frozen, reinit, parts):
  """Python bools like `params`: True where the parameter trains (while `frozen`, the `reinit`
  parts)."""
  names = {name for part in reinit for name in parts[part]}
  return {
    key: jax.tree.map(lambda _, k=key: (not frozen) or k in names, value)
    for key, value in params.items()
  }


# Not optax.multi_transform with set_to_zero: its state's tree changes at the unfreeze, and a
# checkpoint restores into the first phase's state.
def masked_update(params, grads, opt_state, tx, mask):
  """One optimizer step of the parameters where `mask` is True; the others come back the same
  arrays."""
  grads = jax.tree.map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = jax.tree.map(lambda p, u, m: p + u.astype(p.dtype) if m else p, params, updates, mask)
  return params, opt_state


# Not jax.make_mesh: on TPUs it orders the devices into a ring and interleaves a slice's hosts, so a
# process's devices would no longer hold the contiguous slice of each batch it loads.
def make_mesh(devices=None):
  """The 1-D 'data' mesh over `devices` (default: all), in the order given."""
  return Mesh(np.asarray(devices if devices is not None else jax.devices()), ('data',))


def shardings(mesh):
  """(replicated, batch-sharded) NamedShardings."""
  return NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))


def is_abstract(tree):
  """Whether every leaf of `tree` is a ShapeDtypeStruct (a state built by `abstract_state`)."""
  return all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(tree))


def replicate(ctx, tree):
  """`tree` replicated on the mesh (an abstract tree: its ShapeDtypeStructs given the sharding)."""
  if is_abstract(tree):
    return jax.tree.map(lambda s: s.update(sharding=ctx.replicated), tree)
  return jax.device_put(tree, ctx.replicated)


def zero_sums(mesh):
  """ZERO_SUMS as f32 arrays replicated on `mesh`."""
  sums = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), ZERO_SUMS)
  return jax.device_put(sums, shardings(mesh)[0])


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


# Not functools.partial over a placed seed: the seed stays an argument of the compiled step (one
# compilation per arm), lowered as its shape for compile-only devices, placed at the first call.
@dataclasses.dataclass(frozen=True)
class Seeded:
  """A jitted step whose last argument, the run seed, is bound (`lower` and `compile` keep it)."""

  fn: Any
  seed: Any  # uint32 scalar (numpy)
  sharding: Any  # replicated over the mesh

  def __call__(self, *args):
    return self.fn(*args, self.placed_seed)

  @functools.cached_property
  def placed_seed(self):
    return jax.device_put(self.seed, self.sharding)

  def lower(self, *args):
    spec = jax.ShapeDtypeStruct(self.seed.shape, self.seed.dtype, sharding=self.sharding)
    return Seeded(self.fn.lower(*args, spec), self.seed, self.sharding)

  def compile(self, *args, **kwargs):
    return Seeded(self.fn.compile(*args, **kwargs), self.seed, self.sharding)

  def as_text(self):
    return self.fn.as_text()


def jit_step(fn, mesh, seed, in_shardings, out_shardings, donate, config=None):
  """`fn` jitted with these shardings (the seed's appended), its last argument the run seed bound;
  with `config`, traced under its matmul precision whatever the caller's context."""
  replicated, _ = shardings(mesh)
  jitted = jax.jit(
    numerics_setup.with_precision(fn, config) if config is not None else fn,
    in_shardings=(*in_shardings, replicated),
    out_shardings=out_shardings,
    donate_argnums=donate,
  )
  return Seeded(jitted, np.asarray(seed, np.uint32), replicated)


def make_gather(mesh):
  """jit(data, indices) -> a batch gathered from a device-resident split, sharded as host-fed."""
  replicated, sharded = shardings(mesh)
  return jax.jit(
    lambda data, indices: {'image': data['image'][indices], 'label': data['label'][indices]},
    in_shardings=(replicated, sharded),
    out_shardings=sharded,
  )


def feed(ctx, on_device=None):
  """None (host feeding) or (device-resident training split, jitted gather)."""
  if not (ctx.config.data.on_device if on_device is None else on_device):
    return None
  data = batching.on_devices(ctx.dataset.train, ctx.replicated)
  indices = jax.ShapeDtypeStruct((ctx.config.batch_size,), np.int32, sharding=ctx.sharded)
  return data, process.precompile(make_gather(ctx.mesh), checkpoint.abstract(data), indices)


def batches(ctx, start, stop, device_feed=None):
  """Training batches of global steps [start, stop), sharded, prefetched."""
  c = ctx.config
  return batching.train_batches(
    ctx.dataset.train,
    c.batch_size,
    ctx.data_seed,
    start,
    stop,
    ctx.sharded,
    c.data.prefetch,
    device_feed,
  )


def eval_batch(ctx):
  """The global evaluation batch (batching.eval_batch_size) of the test split on the mesh."""
  return batching.eval_batch_size(
    len(ctx.dataset.test), ctx.config.eval_batch_size, ctx.mesh.devices.size
  )
