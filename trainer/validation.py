"""Checks that run before any data is loaded or anything compiled, and the one resolution of a
config.

`resolve(config)` is the one validation path: every entry point (train.py, the sweep, the study,
the divergence tool, the benchmarks) loads a config (configs/loader.py), resolves it once (numerics
formats expanded, every field checked) and hands the frozen result on; trainer/, numerics/ and the
launchers only read it (`require_resolved` says so loudly where a driver forgot). Each failure is a
`ConfigError` whose message is one line naming the field and the fix; train.py prints it and exits
non-zero, leaving the workdir untouched.
"""

import math
import os
import sys
import uuid

import ml_collections
import numpy as np

import input_pipeline
from input_pipeline import base, batching
from models import resnet
from numerics import profiles
from numerics import setup as numerics_setup
from trainer import checkpointing, optim
from runrecord import record


class ConfigError(ValueError):
  """A config, flag or environment problem found before compute starts."""


SEED_MAX = 2**32 - 1  # the seed reaches the steps as a uint32 (trainer/steps.py)
STEP_MAX = 2**31 - 1  # the training state's step counter is an int32 (trainer/steps.py)
WIDTH_MIN = 1 / 64  # the stem's 64 channels times the width: at least one channel
# Every image each dataset holds (input_pipeline/digits.py, celeba.py): the training split is
# about (1 - data.test_fraction) of it, which bounds the steps of an epoch before any data loads.
DATASET_IMAGES = {'digits': 1797, 'celeba': 202599}


def _positive_int(config, name):
  value = config[name]  # ConfigDict takes dotted names
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise ConfigError(f'config.{name} must be a positive integer, got {value!r}')
  return value


def _number(config, name, rule, ok):
  """The field's value if it is a finite real number (not a bool, a string, NaN or inf) for which
  `ok(value)` holds; else a ConfigError naming the field and `rule` (its range, in words)."""
  value = config[name]  # ConfigDict takes dotted names
  real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not (real and ok(value)):
    raise ConfigError(f'config.{name} must be a finite number {rule}, got {value!r}')
  return value


def resolve(config):
  """The resolved config: a frozen copy of `config` (its overrides already applied, by
  configs/common.apply_overrides) with the product formats expanded (numerics/profiles.py) and
  every field checked; ConfigError (one line) on bad input.

  Resolving twice is a programming error (TypeError): a resolved config is final.
  """
  if is_resolved(config):
    raise TypeError('the config is already resolved: resolve it once, at the entry point, and '
                    'hand the resolved config on')
  config = config.copy_and_resolve_references()  # a copy: the caller's config stays as written
  try:
    profiles.expand(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _check_fields(config)
  return ml_collections.FrozenConfigDict(config)


def is_resolved(config):
  return isinstance(config, ml_collections.FrozenConfigDict)


def require_resolved(config, who):
  """TypeError unless `config` came from `resolve` (`who`: the function that needs it)."""
  if not is_resolved(config):
    raise TypeError(f'{who} needs a resolved config: call trainer.validation.resolve(config) once, '
                    'at the entry point, and pass its result')


# Every seed a config holds, and what takes it: each in [0, SEED_MAX], where it enters (a wrapped
# init_seed 2^32 trained as 0 and was recorded as given; data_seed 2^32 an OverflowError after the
# workdir existed; split_seed -1 an error naming sklearn's random_state). None: the field's
# default (init_seed and data_seed: config.seed, configs/common.py init_seed_of, data_seed_of).
SEEDS = {'seed': 'the PRNG takes it as a uint32',
         'init_seed': 'the PRNG takes it as a uint32; None: config.seed',
         'data_seed': 'the data order and the PRNG take it as a uint32; None: config.seed',
         'data.split_seed': "the test split's random generator takes it as a uint32"}


def _check_seed(config):
  for name, why in SEEDS.items():
    seed = config[name]  # ConfigDict takes dotted names
    if seed is None and name in ('init_seed', 'data_seed'):
      continue
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= SEED_MAX:
      raise ConfigError(f'config.{name} must be an integer in [0, {SEED_MAX}] ({why}), got '
                        f'{seed!r}')


def check_steps(config, per_epoch, estimated=False):
  """The run's steps (num_epochs x `per_epoch`) must fit the int32 step counter."""
  total = config.num_epochs * per_epoch
  if total > STEP_MAX:
    about = 'about ' if estimated else ''
    raise ConfigError(
        f'config.num_epochs={config.num_epochs}: {about}{total:,} steps ({about}{per_epoch:,} per '
        f'epoch) overflow the int32 step counter ({STEP_MAX:,}): use fewer epochs or a larger '
        'config.batch_size')


def _estimated_steps_per_epoch(config):
  """A lower bound of the steps per epoch from the dataset's size alone (1 if unknown); a 10 %
  margin for how a split rounds, so a run that fits is never refused here (run.build checks the
  exact count)."""
  images = DATASET_IMAGES.get(config.data.name, 0) * (1 - config.data.test_fraction) * 0.9
  return max(1, int(images) // config.batch_size)


def _check_fields(config):
  """Static checks of every field the trainer reads."""
  _check_seed(config)
  for name in ('num_epochs', 'batch_size', 'eval_batch_size', 'eval_every_epochs',
               'log_every_steps', 'keep_checkpoints'):
    _positive_int(config, name)
  replicate = config.replicate  # names a same-seed replicate: its own workdir, nothing else
  if not isinstance(replicate, int) or isinstance(replicate, bool) or replicate < 0:
    raise ConfigError(f'config.replicate must be an integer >= 0 (0, 1, 2, ...: same-seed '
                      f'replicates of one run), got {replicate!r}')
  if not isinstance(config.checkpoint_every_steps, int) or config.checkpoint_every_steps < 0:
    raise ConfigError('config.checkpoint_every_steps must be an integer >= 0 (0: every epoch), '
                      f'got {config.checkpoint_every_steps!r}')
  o = config.optim
  for name in ('optim.learning_rate', 'optim.eps'):
    _number(config, name, '> 0', lambda v: v > 0)
  for name in ('optim.weight_decay', 'optim.warmup_epochs'):
    _number(config, name, '>= 0', lambda v: v >= 0)
  for name in ('optim.b1', 'optim.b2'):  # 1 zeroes AdamW's bias correction: NaN at step 1
    _number(config, name, 'in [0, 1)', lambda v: 0 <= v < 1)
  if not isinstance(o.freeze_epochs, int) or o.freeze_epochs < 0:
    raise ConfigError(f'config.optim.freeze_epochs must be an integer >= 0, got '
                      f'{o.freeze_epochs!r}')
  if o.freeze_epochs >= config.num_epochs:
    raise ConfigError(f'config.optim.freeze_epochs ({o.freeze_epochs}) must be smaller than '
                      f'config.num_epochs ({config.num_epochs}): nothing would train unfrozen')
  if o.schedule not in optim.SCHEDULES:
    raise ConfigError(f'config.optim.schedule must be one of {optim.SCHEDULES}, got '
                      f'{o.schedule!r}')
  unknown = [part for part in config.model.reinit if part not in optim.PARTS]
  if unknown:
    raise ConfigError(f'config.model.reinit may name {sorted(optim.PARTS)}, got {unknown}')
  if o.freeze_epochs and not config.model.reinit:
    raise ConfigError('config.optim.freeze_epochs > 0 needs config.model.reinit to name the parts '
                      "that train while the backbone is frozen, e.g. ('stem', 'head')")
  if config.data.name not in input_pipeline.DATASETS:
    raise ConfigError(f'config.data.name must be one of {input_pipeline.DATASETS}, got '
                      f'{config.data.name!r}')
  if config.data.normalization not in base.NORMALIZATIONS:
    raise ConfigError(f'config.data.normalization must be one of {sorted(base.NORMALIZATIONS)}, '
                      f'got {config.data.normalization!r}')
  _positive_int(config, 'data.image_size')
  prefetch = config.data.prefetch  # each batch ahead is held on the devices; 0: none ahead
  if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= 64:
    raise ConfigError(f'config.data.prefetch must be an integer in [0, 64] (batches prepared '
                      f'ahead, each held on the devices), got {prefetch!r}')
  _number(config, 'data.test_fraction', 'in (0, 1)', lambda v: 0 < v < 1)
  try:
    resnet.check_stem(config.model.stem)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _number(config, 'model.width', f'>= 1/64 = {WIDTH_MIN} (the stem\'s 64 channels times the '
          'width must give at least one channel)', lambda v: v >= WIDTH_MIN)
  check_steps(config, _estimated_steps_per_epoch(config), estimated=True)
  try:
    numerics_setup.check(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def check_devices(config, num_devices, num_processes, device_bytes):
  """Batch sizes must split evenly over devices and processes (and BN groups within a device),
  and a training step's activations must fit (`check_activations`, with `device_bytes`, the
  smallest local device's memory (`device_memory`), and the host's)."""
  for name in ('batch_size', 'eval_batch_size'):
    if config[name] % num_devices:
      raise ConfigError(f'config.{name}={config[name]} is not divisible by the {num_devices} '
                        f'devices: use a multiple of {num_devices}')
    if config[name] % num_processes:
      raise ConfigError(f'config.{name}={config[name]} is not divisible by the {num_processes} '
                        'processes')
  group = config.numerics.batchnorm_group
  if group and (config.batch_size // num_devices) % group:
    raise ConfigError(f'config.numerics.batchnorm_group={group} must divide the per-device batch '
                      f'{config.batch_size // num_devices} (batch_size / devices)')
  check_activations(config, num_devices, device_bytes, base.host_memory())


def activation_bytes(config, batch):
  """A lower bound of a training step's activations for `batch` images: the outputs of every
  convolution (models/resnet.py conv_output_values) in the compute dtype."""
  values = resnet.conv_output_values(config.data.image_size, float(config.model.width),
                                     config.model.stem)
  return batch * values * np.dtype(config.numerics.compute_dtype).itemsize


def eval_activation_bytes(config, batch):
  """A lower bound of an evaluation step's activations for `batch` images: a forward pass keeps
  no activation for a backward one, but holds the first convolution's input (one channel at
  least) and output (ResNet-18's largest: 64 x width channels at ceil(size / 2)^2 after the
  imagenet stem's 7x7/2, padding 3; size^2 after the small stem) for the whole batch at once."""
  size = config.data.image_size
  side = -(-size // 2) if config.model.stem == 'imagenet' else size
  values = side * side * resnet.stage_channels(float(config.model.width))[0] + size * size
  return batch * values * np.dtype(config.numerics.compute_dtype).itemsize


def check_activations(config, num_devices, device_bytes, host_bytes):
  """Refuse, before any data is loaded or anything compiled, a training step whose activations
  cannot fit: a lower bound (the outputs of every convolution, models/resnet.py
  conv_output_values, in the compute dtype) for the per-device batch against `device_bytes` (the
  smallest device's memory), or, where devices do not report memory (CPU, whose devices share
  the host's), for the whole batch against `host_bytes`; and the same for an evaluation step's
  batch, config.eval_batch_size (eval_activation_bytes: forward only)."""
  size, width = config.data.image_size, float(config.model.width)
  limit = device_bytes or host_bytes
  where = 'a device has' if device_bytes else 'this machine has'
  for field, bound in (('batch_size', activation_bytes), ('eval_batch_size', eval_activation_bytes)):
    batch = config[field] // num_devices if device_bytes else config[field]
    need, per_example = bound(config, batch), bound(config, 1)
    if not limit or need <= limit:
      continue
    held = 'convolution outputs' if field == 'batch_size' else "the first convolution's input and output"
    what = (f'({batch} images x {per_example / 2**20:,.1f} MiB of {held} at '
            f'{size}x{size}, model.width {width:g}, {config.numerics.compute_dtype}), over the '
            f'{limit / 2**30:,.1f} GiB {where}')
    if field == 'batch_size':
      raise ConfigError(f'config.data.image_size={size}: a training step keeps at least '
                        f'{need / 2**30:,.1f} GiB of activations {what}: use a smaller '
                        'config.data.image_size or config.batch_size')
    raise ConfigError(f'config.eval_batch_size={config[field]}: an evaluation step holds at least '
                      f'{need / 2**30:,.1f} GiB of activations {what}: use a smaller '
                      'config.eval_batch_size')


def check_dataset(config, dataset, device_bytes=None):
  """The dataset must give a full batch; with data.on_device its training split must fit.

  `device_bytes`: the memory of the smallest local device (None where devices do not report it,
  e.g. CPU). A device-resident split may take at most half of it: the rest is the model's.
  """
  if config.batch_size > len(dataset.train):
    raise ConfigError(f'config.batch_size={config.batch_size} is larger than the '
                      f'{len(dataset.train)} training examples: no full batch per epoch')
  need = batching.nbytes(dataset.train) if config.data.on_device else 0
  if device_bytes and need > device_bytes / 2:
    raise ConfigError(f'config.data.on_device=True needs {need / 2**30:.2f} GiB for the training '
                      f'split on every device, over half of the {device_bytes / 2**30:.2f} GiB a '
                      'device has: set config.data.on_device=False (host feeding) or a smaller '
                      'config.data.image_size')


def memory_stat(devices, key):
  """`key` of each device's memory_stats() (e.g. 'bytes_limit'), for the devices reporting it."""
  values = []
  for device in devices:
    try:
      stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
      stats = None
    if stats and stats.get(key) is not None:
      values.append(int(stats[key]))
  return values


def device_memory(devices):
  """The smallest `bytes_limit` the devices report, or None when none reports one (CPU)."""
  limits = [v for v in memory_stat(devices, 'bytes_limit') if v]
  return min(limits) if limits else None


def absolute_workdir(workdir):
  """Local paths made absolute once, at the entry point (Orbax refuses relative ones); gs:// etc.
  unchanged."""
  return workdir if '://' in workdir else os.path.abspath(os.path.expanduser(workdir))


def check_workdir(workdir, extra_files=()):
  """The workdir must be a folder (or creatable as one) and writable (probed with a temporary
  file), and what a run keeps there (`check_layout`, with `extra_files`) must be what the run will
  read and write.
  Returns the folders it created, outermost first (`remove_created` takes them away again when
  the run is refused before it writes anything)."""
  if not workdir:
    raise ConfigError('--workdir is required')
  check_path_encoding(workdir, '--workdir')
  if '://' in str(workdir):
    return []
  existing = _nearest_existing(workdir)
  if not os.path.isdir(existing):
    where = '' if existing == os.path.abspath(workdir) else f' cannot be created: {existing}'
    raise ConfigError(f'--workdir={workdir}{where} is a file, not a folder: choose another '
                      'path, or move the file away')
  created = []
  try:
    for folder in _missing_folders(workdir):
      try:
        os.mkdir(folder)
        created.append(folder)
      except FileExistsError:
        if not os.path.isdir(folder):
          raise
        # another process of this run (or a second run started at once) made it first: theirs
    probe = os.path.join(workdir, f'.write_probe_{uuid.uuid4().hex}')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    remove_created(created)
    raise ConfigError(f'--workdir={workdir} is not writable ({e.strerror}): choose another '
                      'directory') from None
  try:
    check_layout(workdir, extra_files)
  except ConfigError:
    remove_created(created)
    raise
  return created


def check_path_encoding(path, flag):
  """A path this process can hand to every writer: the file system's encoding (ASCII under a
  non-UTF-8 locale such as LC_ALL=C with Python's UTF-8 mode off) and UTF-8 (what Orbax and
  TensorStore pass to C++) must both spell it; otherwise the first checkpoint, an epoch later,
  fails."""
  try:
    str(path).encode(sys.getfilesystemencoding())
    str(path).encode('utf-8')
  except UnicodeEncodeError:
    raise ConfigError(
        f'{flag}={path!a} holds characters this process cannot pass to the checkpoint writer '
        f'under its locale (file names in {sys.getfilesystemencoding()}): use a UTF-8 locale '
        '(export LC_ALL=C.UTF-8, or PYTHONUTF8=1), or an ASCII path') from None


def _nearest_existing(path):
  """`path` (absolute) or its closest existing ancestor."""
  path = os.path.abspath(path)
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def _missing_folders(workdir):
  """The folders from the nearest existing ancestor down to `workdir`, outermost first."""
  path, missing = os.path.abspath(workdir), []
  while not os.path.lexists(path):
    missing.insert(0, path)
    path = os.path.dirname(path)
  return missing


def remove_created(created):
  """Remove the folders check_workdir created (innermost first), each only while empty: a run
  refused before it wrote anything leaves nothing behind."""
  for folder in reversed(created):
    try:
      os.rmdir(folder)
    except OSError:
      return  # not empty (or gone): keep it and everything above


def layout_problem(path, folder):
  """What is wrong with existing `path` for a run that keeps a folder (or a file) there, or None."""
  kinds = ('folder', 'file') if folder else ('file', 'folder')
  if folder != os.path.isdir(path):
    return f'is a {kinds[1]}, not the {kinds[0]} a run keeps there'
  if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
    return 'is not writable'
  return None


def check_layout(workdir, extra_files=()):
  """Every entry of the run layout (trainer/checkpointing.py RUN_FOLDERS, RUN_FILES, the callers'
  `extra_files`: trainer/lock.py FILES, a sweep's train.log; and each step folder under
  checkpoints/) that exists must be the kind of entry the run uses, and writable: one
  line naming the path otherwise, before anything is read or written there (a `checkpoints`
  file would otherwise be found only at the first save, after a fresh start had rewritten the
  metrics)."""
  entries = [(name, True) for name in checkpointing.RUN_FOLDERS]
  entries += [(name, False) for name in checkpointing.RUN_FILES + tuple(extra_files)]
  steps = os.path.join(workdir, record.CHECKPOINTS)
  if os.path.isdir(steps):
    entries += [(os.path.join(record.CHECKPOINTS, name), True)
                for name in sorted(os.listdir(steps)) if name.isdigit()]
  for name, folder in entries:
    path = os.path.join(workdir, name)
    problem = layout_problem(path, folder) if os.path.lexists(path) else None
    if problem:
      raise ConfigError(f'--workdir: {path} {problem}: move it out of the workdir (or fix its '
                        'permissions), or use another --workdir; nothing was written')
