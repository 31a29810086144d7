"""A resolved config against what a run finds: the devices and processes its mesh spans, their
memory (a step's activations, a lower bound, must fit), and the training split (a full batch, the
exact step count, a device-resident split's size). trainer/run.py `build` calls `check_devices`
and `check_dataset` (before and after loading the data), the sweep `check_devices` with the
devices its runs will see. What the config alone decides is checked by configs/validation.py
`resolve`. No JAX here. See docs/configs.md.
"""

import ml_collections

from configs import validation
from input_pipeline import base
from models import architecture
from numerics import formats


def check_devices(
  config: ml_collections.ConfigDict, num_devices: int, num_processes: int, device_bytes: int | None
) -> None:
  """Batch sizes must split evenly over `num_devices` and `num_processes` (and BatchNorm groups
  within a device), and a step's activations must fit (`check_activations`).

  Args:
    num_devices, num_processes: the devices and processes the run's mesh spans.
    device_bytes: the smallest device's memory, or None where devices do not report it (CPU: the
      host's memory bounds the whole batch instead).
  """
  for name in ('batch_size', 'eval_batch_size'):
    if config[name] % num_devices:
      raise validation.ConfigError(
        f'config.{name}={config[name]} is not divisible by the {num_devices} '
        f'devices: use a multiple of {num_devices}'
      )
    if config[name] % num_processes:
      raise validation.ConfigError(
        f'config.{name}={config[name]} is not divisible by the {num_processes} processes'
      )
  group = config.numerics.batchnorm_group
  if group and (config.batch_size // num_devices) % group:
    raise validation.ConfigError(
      f'config.numerics.batchnorm_group={group} must divide the per-device batch '
      f'{config.batch_size // num_devices} (batch_size / devices)'
    )
  check_activations(config, num_devices, device_bytes, base.host_memory())


def activation_bytes(config: ml_collections.ConfigDict, batch: int) -> int:
  """A lower bound of a training step's activations for `batch` images: the outputs of every
  convolution (models/architecture.py conv_output_values) in the compute dtype."""
  values = architecture.conv_output_values(
    config.data.image_size, float(config.model.width), config.model.stem
  )
  return batch * values * formats.DTYPE_BYTES[config.numerics.compute_dtype]


def eval_activation_bytes(config: ml_collections.ConfigDict, batch: int) -> int:
  """A lower bound of an evaluation step's activations for `batch` images: a forward pass keeps
  no activation for a backward one, but holds the first convolution's input and output
  (models/architecture.py first_conv_values) for the whole batch at once."""
  values = architecture.first_conv_values(
    config.data.image_size, float(config.model.width), config.model.stem
  )
  return batch * values * formats.DTYPE_BYTES[config.numerics.compute_dtype]


def check_activations(
  config: ml_collections.ConfigDict,
  num_devices: int,
  device_bytes: int | None,
  host_bytes: int | None,
) -> None:
  """Refuse a step whose activations cannot fit: the lower bounds `activation_bytes` (training,
  config.batch_size) and `eval_activation_bytes` (evaluation, config.eval_batch_size) of the
  per-device batch against `device_bytes` (the smallest device's memory), or, where devices do
  not report memory (CPU, whose devices share the host's), of the whole batch against
  `host_bytes`."""
  size, width = config.data.image_size, float(config.model.width)
  limit = device_bytes or host_bytes
  where = 'a device has' if device_bytes else 'this machine has'
  bounds = (('batch_size', activation_bytes), ('eval_batch_size', eval_activation_bytes))
  for field, bound in bounds:
    batch = config[field] // num_devices if device_bytes else config[field]
    need, per_example = bound(config, batch), bound(config, 1)
    if not limit or need <= limit:
      continue
    held = (
      'convolution outputs' if field == 'batch_size' else "the first convolution's input and output"
    )
    what = (
      f'({batch} images x {per_example / 2**20:,.1f} MiB of {held} at '
      f'{size}x{size}, model.width {width:g}, {config.numerics.compute_dtype}), over the '
      f'{limit / 2**30:,.1f} GiB {where}'
    )
    if field == 'batch_size':
      raise validation.ConfigError(
        f'config.data.image_size={size}: a training step keeps at least '
        f'{need / 2**30:,.1f} GiB of activations {what}: use a smaller '
        'config.data.image_size or config.batch_size'
      )
    raise validation.ConfigError(
      f'config.eval_batch_size={config[field]}: an evaluation step holds at least '
      f'{need / 2**30:,.1f} GiB of activations {what}: use a smaller '
      'config.eval_batch_size'
    )


def check_dataset(
  config: ml_collections.ConfigDict,
  train_examples: int,
  train_bytes: int,
  device_bytes: int | None = None,
) -> None:
  """The training split must give a full batch, its epochs must fit the step counter, and with
  data.on_device it must fit on a device.

  Args:
    train_examples: images in the training split (loaded, or declared: registry.declared).
    train_bytes: what the split's images and labels take (input_pipeline/batching.py nbytes).
    device_bytes: the smallest device's memory (None where devices do not report it, e.g. CPU).
      A device-resident split may take at most half of it: the rest is the model's.
  """
  if config.batch_size > train_examples:
    raise validation.ConfigError(
      f'config.batch_size={config.batch_size} is larger than the '
      f'{train_examples} training examples: no full batch per epoch'
    )
  validation.check_steps(config, train_examples // config.batch_size)  # full batches (batching.py)
  need = train_bytes if config.data.on_device else 0
  if device_bytes and need > device_bytes / 2:
    raise validation.ConfigError(
      f'config.data.on_device=True needs {need / 2**30:.2f} GiB for the training '
      f'split on every device, over half of the {device_bytes / 2**30:.2f} GiB a '
      'device has: set config.data.on_device=False (host feeding) or a smaller '
      'config.data.image_size'
    )
