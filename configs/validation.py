"""The one resolution of a config and every check of its fields (`resolve`, before JAX may start),
and its checks against the devices and the data. A failure is a one-line `ConfigError`."""

import functools
import math
import os
import re
import subprocess
import sys

import ml_collections

import input_pipeline
import models
from configs import common
from numerics import formats


class ConfigError(ValueError):
  """A config, flag or environment problem found before compute starts (one line)."""


SEED_MAX = 2**32 - 1  # the seed reaches the steps as a uint32 (trainer/run.py Seeded)
STEP_MAX = 2**31 - 1  # the training state's step counter is an int32
WIDTH_MIN = 1 / 64  # the stem's 64 channels times the width: at least one channel
# Every seed a config holds and what takes it, each in [0, SEED_MAX] (init_seed, data_seed: or None)
SEEDS = {
  'seed': 'the PRNG takes it as a uint32',
  'init_seed': 'the PRNG takes it as a uint32; None: config.seed',
  'data_seed': 'the data order and the PRNG take it as a uint32; None: config.seed',
  'data.split_seed': "the test split's random generator takes it as a uint32",
}
# XLA reads XLA_FLAGS when its first backend starts and ends the process (a fatal 'F' log line)
# on a flag it does not know; a CPU backend in a child process reads them the same way in a second.
FLAG_PROBE = 'import jax; jax.devices("cpu")'
COUNTS = (
  'num_epochs batch_size eval_batch_size eval_every_epochs log_every_steps keep_checkpoints'
).split()  # each a positive integer


def resolve(config):
  """A frozen copy of `config`, every field checked, the numerics formats written out."""
  if isinstance(config, ml_collections.FrozenConfigDict):
    raise TypeError(
      'the config is already resolved: resolve it once, at the entry point, and '
      'hand the resolved config on'
    )
  config = config.copy_and_resolve_references()  # a copy: the caller's config stays as written
  for name, why in SEEDS.items():
    if not (config[name] is None and name in ('init_seed', 'data_seed')):
      _int_in(config, name, 0, SEED_MAX, f' ({why})')
  for name in COUNTS:
    _int_in(config, name, 1)
  _int_in(config, 'replicate', 0, why=' (0, 1, 2, ...: same-seed replicates of one run)')
  _int_in(config, 'checkpoint_every_steps', 0, why=' (0: every epoch)')
  for name in ('optim.learning_rate', 'optim.eps'):
    _number(config, name, '> 0', lambda v: v > 0)
  for name in ('optim.weight_decay', 'optim.warmup_epochs'):
    _number(config, name, '>= 0', lambda v: v >= 0)
  for name in ('optim.b1', 'optim.b2'):  # 1 zeroes AdamW's bias correction: NaN at step 1
    _number(config, name, 'in [0, 1)', lambda v: 0 <= v < 1)
  _int_in(config, 'optim.freeze_epochs', 0)
  if config.optim.freeze_epochs >= config.num_epochs:
    raise ConfigError(
      f'config.optim.freeze_epochs ({config.optim.freeze_epochs}) must be smaller than '
      f'config.num_epochs ({config.num_epochs}): nothing would train unfrozen'
    )
  _one_of(config, 'optim.schedule', common.SCHEDULES)
  if config.optim.freeze_epochs and not config.model.reinit:
    raise ConfigError(
      'config.optim.freeze_epochs > 0 needs config.model.reinit to name the parts '
      "that train while the backbone is frozen, e.g. ('stem', 'head')"
    )
  try:
    dataset = input_pipeline.get(config.data.name)
  except input_pipeline.DataError as e:
    raise ConfigError(str(e)) from e
  for field, choices in (('task', dataset.tasks), ('split', dataset.splits)):
    if choices:
      _one_of(config, f'data.{field}', choices, f' for {config.data.name}')
  _one_of(config, 'data.normalization', sorted(input_pipeline.NORMALIZATIONS))
  _int_in(config, 'data.image_size', 1)
  _int_in(config, 'data.prefetch', 0, 64, ' (batches prepared ahead, each held on the devices)')
  _number(config, 'data.test_fraction', 'in (0, 1)', lambda v: 0 < v < 1)
  problem = models.missing(config.model.name)
  if problem:
    raise ConfigError(problem)
  _one_of(config, 'model.stem', models.STEMS)
  rule = f">= 1/64 = {WIDTH_MIN} (the stem's 64 channels times the width must give one channel)"
  _number(config, 'model.width', rule, lambda v: v >= WIDTH_MIN)
  if config.model.init_from and config.model.width != 1.0:
    raise ConfigError(
      f'config.model.width must be 1.0 with config.model.init_from (pretrained weights are full '
      f'width), got {config.model.width}; set model.width=1.0'
    )
  check_numerics(config)
  _check_distributed(config)
  train, _ = dataset.split_sizes(config.data)  # less 10 %: a lower bound of the steps per epoch
  check_steps(config, max(1, int(train * 0.9) // config.batch_size), estimated=True)
  formats.expand(config)
  return ml_collections.FrozenConfigDict(config)


def require_resolved(config, who):
  """TypeError unless `config` came from `resolve` (`who`: the function that needs it)."""
  if not isinstance(config, ml_collections.FrozenConfigDict):
    raise TypeError(
      f'{who} needs a resolved config: call configs.validation.resolve(config) '
      'once, at the entry point, and pass its result'
    )


def _integer(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _int_in(config, name, low, high=None, why=''):
  """The field's value if an integer (not a bool) in [low, high], else a ConfigError saying so."""
  value = config[name]  # ConfigDict takes dotted names
  if not (_integer(value) and low <= value and (high is None or value <= high)):
    kind = 'an integer >= 0' if low == 0 else 'a positive integer'
    if high is not None:
      kind = f'an integer in [{low}, {high}]'
    raise ConfigError(f'config.{name} must be {kind}{why}, got {value!r}')
  return value


def _number(config, name, rule, ok):
  """The field's value if a finite real number (not a bool) `ok` takes, else a ConfigError."""
  value = config[name]  # ConfigDict takes dotted names
  real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not (real and ok(value)):
    raise ConfigError(f'config.{name} must be a finite number {rule}, got {value!r}')
  return value


def _one_of(config, name, choices, extra='', unnamed=()):
  """ConfigError unless the field is one of `choices` (or of `unnamed`, left out of the message)."""
  if config[name] not in (*choices, *unnamed):
    raise ConfigError(f'config.{name} must be one of {tuple(choices)}{extra}, got {config[name]!r}')


def check_numerics(config):
  """Every config.numerics value the code can honour (formats and profile not contradicting)."""
  n = config.numerics
  _one_of(config, 'numerics.matmul_precision', formats.PRECISIONS)
  for field in ('compute_dtype', 'param_dtype'):
    _one_of(config, f'numerics.{field}', formats.DTYPES)
  _one_of(config, 'numerics.profile', tuple(formats.PROFILES), ' (or empty)', ('',))
  named = formats.profile_formats(n)
  for kind in formats.KINDS:
    explicit = n[f'{kind}_format']
    _one_of(config, f'numerics.{kind}_format', formats.names(), ' (or empty)', ('',))
    if explicit and kind in named and explicit != named[kind]:
      raise ConfigError(
        f'config.numerics.{kind}_format={explicit!r} contradicts '
        f'config.numerics.profile={n.profile!r} ({kind} format {named[kind]!r}): '
        'give one of them, or the same format'
      )
  _int_in(config, 'numerics.batchnorm_group', 0)
  if not isinstance(n.gpu_deterministic, bool):
    raise ConfigError(
      f'config.numerics.gpu_deterministic must be True or False, got {n.gpu_deterministic!r}'
    )
  flags = n.xla_flags
  if not isinstance(flags, str) or any(not f.startswith('--xla_') for f in flags.split()):
    raise ConfigError(
      f'config.numerics.xla_flags must be space-separated --xla_* flags, got {n.xla_flags!r}'
    )
  known_flags(tuple(flags.split()))
  _one_of(config, 'numerics.conv_impl', formats.CONV_IMPLS)
  _one_of(config, 'numerics.emulate_impl', formats.EMULATE_IMPLS)


@functools.lru_cache(maxsize=None)
def known_flags(flags):
  """ConfigError when XLA refuses any of `flags` (a tuple), probed in a child process."""
  if not flags:
    return
  env = {**os.environ, 'XLA_FLAGS': ' '.join(flags), 'JAX_PLATFORMS': 'cpu'}
  env['TF_CPP_MIN_LOG_LEVEL'] = '0'  # XLA's error lines say why
  probe = subprocess.run(
    [sys.executable, '-c', FLAG_PROBE], env=env, capture_output=True, text=True, check=False
  )
  if probe.returncode == 0:
    return
  logged = [
    line.split('] ', 1)[-1] for line in probe.stderr.splitlines() if re.match(r'[EF]\d{4} ', line)
  ]  # XLA's error and fatal log lines, first is why
  said = logged[0] if logged else f'exit code {probe.returncode}'
  raise ConfigError(
    f'config.numerics.xla_flags: XLA refuses {" ".join(flags)!r} ({said}): '
    'remove or correct the flag'
  )


def _check_distributed(config):
  """A named coordinator needs its process count and this process's id."""
  d = config.distributed
  _one_of(config, 'distributed.initialize', common.DISTRIBUTED_MODES)
  if not d.coordinator_address:
    if d.num_processes or d.process_id >= 0:
      raise ConfigError(
        'config.distributed.num_processes/process_id need '
        'config.distributed.coordinator_address (host:port)'
      )
    return
  if ':' not in d.coordinator_address:
    raise ConfigError(
      f'config.distributed.coordinator_address must be host:port, got {d.coordinator_address!r}'
    )
  _int_in(config, 'distributed.num_processes', 1, why=' with a coordinator_address')
  if not _integer(d.process_id) or not 0 <= d.process_id < d.num_processes:
    raise ConfigError(
      f'config.distributed.process_id must be in [0, {d.num_processes}), got {d.process_id!r}'
    )


def check_steps(config, per_epoch, estimated=False):
  """The run's steps must fit the int32 step counter (`estimated`: `per_epoch` is a lower bound)."""
  total = config.num_epochs * per_epoch
  if total > STEP_MAX:
    about = 'about ' if estimated else ''
    raise ConfigError(
      f'config.num_epochs={config.num_epochs}: {about}{total:,} steps ({about}{per_epoch:,} per '
      f'epoch) overflow the int32 step counter ({STEP_MAX:,}): use fewer epochs or a larger '
      'config.batch_size'
    )


def check_devices(
  config: ml_collections.ConfigDict, num_devices: int, num_processes: int, device_bytes: int | None
) -> None:
  """Batches must split evenly over devices and processes (and BatchNorm groups), and fit."""
  for name in ('batch_size', 'eval_batch_size'):
    for count, what in ((num_devices, 'devices'), (num_processes, 'processes')):
      if config[name] % count:
        raise ConfigError(
          f'config.{name}={config[name]} is not divisible by the {count} {what}: use a multiple '
          f'of {count}'
        )
  group = config.numerics.batchnorm_group
  if group and (config.batch_size // num_devices) % group:
    raise ConfigError(
      f'config.numerics.batchnorm_group={group} must divide the per-device batch '
      f'{config.batch_size // num_devices} (batch_size / devices)'
    )
  check_activations(config, num_devices, device_bytes, input_pipeline.host_memory())


def activation_bytes(config: ml_collections.ConfigDict, batch: int, evaluation=False) -> int:
  """A lower bound of a training (or `evaluation`) step's activations for `batch` images, bytes."""
  values = models.get(config.model.name).activation_values(config)[evaluation]
  return batch * values * formats.DTYPE_BYTES[config.numerics.compute_dtype]


def check_activations(
  config: ml_collections.ConfigDict,
  num_devices: int,
  device_bytes: int | None,
  host_bytes: int | None,
) -> None:
  """Refuse a step whose activations cannot fit a device's memory (or, on CPU, the host's)."""
  size, limit = config.data.image_size, device_bytes or host_bytes
  where = 'a device has' if device_bytes else 'this machine has'
  steps = {
    'batch_size': (f'data.image_size={size}: a training step keeps', 'convolution outputs'),
    'eval_batch_size': (
      f'eval_batch_size={config.eval_batch_size}: an evaluation step holds',
      "the first convolution's input and output",
    ),
  }
  for field, (step, held) in steps.items():
    batch = config[field] // num_devices if device_bytes else config[field]
    evaluation = field == 'eval_batch_size'
    fix = 'config.eval_batch_size' if evaluation else 'config.data.image_size or config.batch_size'
    need = activation_bytes(config, batch, evaluation)
    if limit and need > limit:
      raise ConfigError(
        f'config.{step} at least {need / 2**30:,.1f} GiB of activations ({batch} images x '
        f'{activation_bytes(config, 1, evaluation) / 2**20:,.1f} MiB of {held} at {size}x{size}, '
        f'model.width {float(config.model.width):g}, {config.numerics.compute_dtype}), over the '
        f'{limit / 2**30:,.1f} GiB {where}: use a smaller {fix}'
      )


def check_dataset(
  config: ml_collections.ConfigDict,
  train_examples: int,
  train_bytes: int,
  device_bytes: int | None = None,
) -> None:
  """The training split must give a full batch, fit the step counter (and on_device, a device)."""
  if config.batch_size > train_examples:
    raise ConfigError(
      f'config.batch_size={config.batch_size} is larger than the '
      f'{train_examples} training examples: no full batch per epoch'
    )
  check_steps(config, train_examples // config.batch_size)  # full batches (batching.py)
  need = train_bytes if config.data.on_device else 0
  if device_bytes and need > device_bytes / 2:
    raise ConfigError(
      f'config.data.on_device=True needs {need / 2**30:.2f} GiB for the training '
      f'split on every device, over half of the {device_bytes / 2**30:.2f} GiB a '
      'device has: set config.data.on_device=False (host feeding) or a smaller '
      'config.data.image_size'
    )
