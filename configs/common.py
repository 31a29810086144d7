"""Shared config fields, preset parsing, and the `get_config(arg)` plumbing of every config file.

A config file's `get_config(arg)` takes the string after the colon: a comma-separated list of
presets and `key=value` pairs, big_vision style, e.g. `configs/celeba.py:gpu,seed=3` or
`configs/digits.py:smoke,model.width=0.5`. Presets apply in order, then the pairs. Any field can
also be overridden on the command line (`--config.seed=3`), which absl applies afterwards.
"""

import ast

import ml_collections

PRESETS = ('tpu', 'gpu', 'cpu', 'smoke')


def base_config():
  """Every field the code reads, with the reference study's values where it sets one."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # initialisation, data order and augmentation; the data split has its own seed
  c.num_epochs = 25
  c.batch_size = 2048  # global train batch, divided over all devices of all processes
  c.eval_batch_size = 4096  # global; the last eval batch is padded and masked, never dropped
  c.eval_every_epochs = 1
  c.log_every_steps = 50
  c.checkpoint_every_steps = 0  # 0: checkpoint at the end of every epoch only
  c.keep_checkpoints = 3

  c.data = ml_collections.ConfigDict()
  c.data.name = 'digits'
  c.data.task = 'identity'  # celeba: 'identity' or 'attributes'; digits: ignored
  c.data.image_size = 224
  c.data.normalization = 'half'  # 'half' (mean .5, std .5: reference) or 'imagenet'
  c.data.flip = False  # random horizontal flip (on device, deterministic per seed and step)
  c.data.test_fraction = 0.2
  c.data.split_seed = 42  # independent of `seed`: the same split for every training seed
  c.data.split = 'per_identity'  # celeba: 'per_identity' (pooled, split per identity) or 'official'
  c.data.manual_dir = ''  # celeba: folder holding the five official files
  c.data.tfds_dir = ''  # celeba: where the prepared TFDS dataset lives (local path or gs://)
  c.data.cache_dir = ''  # celeba: decoded-image cache; '' = <tfds_dir>/decoded_cache
  c.data.prefetch = 2  # batches prepared ahead on a host thread and put on the devices
  # Keep the whole training split (uint8) on every device and gather each batch there from its
  # indices: no per-step host gather or transfer. The batches, hence the results, are bit-identical
  # to host feeding; it must fit (validation refuses a split over half of a device's memory).
  c.data.on_device = False

  c.model = ml_collections.ConfigDict()
  c.model.name = 'resnet18'
  c.model.width = 1.0  # channel multiplier for every stage (1.0 = torchvision)
  c.model.stem = 'imagenet'  # 'imagenet' (7x7/2 + max-pool) or 'small' (3x3/1, tiny images)
  c.model.init_from = ''  # torchvision-keyed ResNet-18 weights (.pth/.safetensors/.npz)
  c.model.reinit = ('stem', 'head')  # parts re-initialised after loading `init_from`

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 0.01
  c.optim.weight_decay = 0.001
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.warmup_epochs = 1.0
  c.optim.freeze_epochs = 5  # first epochs: only stem and head train
  # 'per_phase': at unfreeze, a fresh AdamW and a fresh warmup-cosine over the remaining epochs
  # (the reference). 'continuous': one AdamW and one warmup-cosine over all epochs.
  c.optim.schedule = 'per_phase'

  c.numerics = ml_collections.ConfigDict()
  c.numerics.matmul_precision = 'default'  # any jax_default_matmul_precision value
  c.numerics.compute_dtype = 'float32'  # activations: 'float32' or 'bfloat16'
  c.numerics.param_dtype = 'float32'  # master weights
  # Product formats (numerics/profiles.py): a named profile ('native', 'tpu_default',
  # 'jax_gpu_default', 'torch_gpu_default', 'f32', 'bf16_noise'; '' = none), or `emulate`, one
  # format for convolutions and dense layers alike ('none' = not given), or each kind's own
  # ('native', 'bf16', 'bf16_3x', 'tf32', 'f32', 'bf16_noise'; '' = as profile/emulate say, else
  # native). Loading expands them: the saved config holds the profile and both formats.
  c.numerics.profile = ''
  c.numerics.emulate = 'none'
  c.numerics.conv_format = ''
  c.numerics.dense_format = ''
  c.numerics.batchnorm_group = 0  # 0: BN over the global batch; K: per group of K examples
  c.numerics.gpu_deterministic = False  # --xla_gpu_deterministic_ops
  # Further XLA flags of this run ('--xla_a=1 --xla_b=2'), set before JAX starts (numerics/setup.py).
  c.numerics.xla_flags = ''
  # How convolutions are computed: 'auto' (im2col for the shapes XLA:CPU runs slowly, xla for the
  # rest and on GPU/TPU), 'xla' or 'im2col' (same product and operand rounding; f32 summation
  # order differs; numerics/ops.py).
  c.numerics.conv_impl = 'auto'
  # How emulated products are computed: 'reference' (rounded operands at HIGHEST), 'fast' (the same
  # operands on the format's native units) or 'auto' (fast on GPU/TPU, CPU: as measured); emulate.py.
  c.numerics.emulate_impl = 'auto'

  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = 'auto'  # 'auto' (cluster env detected), 'yes' or 'no'
  # Name the job explicitly (e.g. 2 processes on localhost); empty/0/-1: read from the environment.
  c.distributed.coordinator_address = ''  # 'host:port' of process 0
  c.distributed.num_processes = 0
  c.distributed.process_id = -1
  return c


def parse_arg(arg, presets):
  """Split 'gpu,seed=3,model.width=0.5' into preset names and {key: literal} overrides."""
  names, overrides = [], {}
  for item in filter(None, (s.strip() for s in (arg or '').split(','))):
    if '=' in item:
      key, value = item.split('=', 1)
      try:
        overrides[key.strip()] = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        overrides[key.strip()] = value  # a bare string
    elif item in presets and not item.startswith('_'):
      names.append(item)
    else:
      names_ok = sorted(p for p in presets if not p.startswith('_'))
      raise ValueError(f'unknown preset {item!r} after the colon: choose from {names_ok} '
                       'or give key=value')
  return names, overrides


def set_field(config, dotted, value):
  """config['a.b.c'] = value, with a one-line error naming the field if it does not exist."""
  *parents, leaf = dotted.split('.')
  node = config
  for name in parents:
    if name not in node:
      raise ValueError(f'unknown config field {dotted!r}')
    node = node[name]
  if leaf not in node:
    raise ValueError(f'unknown config field {dotted!r}')
  old = node[leaf]
  if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(old, tuple) and isinstance(value, (list, str)):
    value = tuple(value) if isinstance(value, list) else (value,)
  node[leaf] = value


def build(arg, presets):
  """Apply `arg`'s presets (functions taking the config) in order, then its key=value pairs."""
  names, overrides = parse_arg(arg, presets)
  config = presets['__base__']()
  for name in names:
    presets[name](config)
  for key, value in overrides.items():
    set_field(config, key, value)
  config.preset = ','.join(names)
  return config
