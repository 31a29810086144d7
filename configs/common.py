"""The config: its schema (`base_config`, locked: a misspelt field is an error), presets and
`key=value` pairs after the colon (`build`), the one override path and the one loader (`load`)."""

import ast
import difflib
import importlib.util
import os
import sys

import ml_collections

SCHEDULES = ('per_phase', 'continuous')  # optim.schedule (trainer/run.py `phases`)
DISTRIBUTED_MODES = ('auto', 'yes', 'no')  # distributed.initialize (trainer/process.py)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUE, FALSE = ('true', '1', 'yes'), ('false', '0', 'no')
# Fields that no longer exist, with how to say the same thing today (one line each).
REMOVED = {
  'numerics.emulate': (
    'numerics.emulate was replaced by the per-kind formats: write '
    'numerics.conv_format=F and numerics.dense_format=F for emulate=F '
    "(emulate='none': leave both unset), or name a numerics.profile"
  )
}


def base_config():
  """Every field the code reads, with the reference study's values where it sets one."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # initialisation, data order and augmentation; the data split has its own seed
  # init_seed (initial weights) and data_seed (order, flips, noise): int fields that follow `seed`
  # while None (a typed reference: `--config.init_seed=3` is checked as an int).
  c.init_seed = ml_collections.FieldReference(None, field_type=int)
  c.data_seed = ml_collections.FieldReference(None, field_type=int)
  c.replicate = 0  # changes nothing but the run's name: same-seed replicates of one run
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
  c.data.on_device = False  # the training split on every device, batches gathered there

  c.model = ml_collections.ConfigDict()
  c.model.name = 'resnet18'  # a module of models/ (resnet18, resnet50) or a dotted module path
  c.model.width = 1.0  # channel multiplier for every stage (1.0 = torchvision)
  c.model.stem = 'imagenet'  # 'imagenet' (7x7/2 + max-pool) or 'small' (3x3/1, tiny images)
  c.model.init_from = ''  # torchvision-keyed weights of the model (.pth/.safetensors/.npz)
  c.model.reinit = ('stem', 'head')  # PARTS fresh after init_from, trained while it is frozen

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 0.01
  c.optim.weight_decay = 0.001
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.warmup_epochs = 1.0
  c.optim.freeze_epochs = 5  # first epochs: only stem and head train
  # 'per_phase' (reference): a fresh AdamW and warmup-cosine at unfreeze; 'continuous': one of each
  c.optim.schedule = 'per_phase'

  c.numerics = ml_collections.ConfigDict()
  c.numerics.matmul_precision = 'default'  # any jax_default_matmul_precision value
  c.numerics.compute_dtype = 'float32'  # activations: 'float32' or 'bfloat16'
  c.numerics.param_dtype = 'float32'  # master weights
  # A profile (formats.PROFILES) names both kinds' formats; a kind's own: '' = the profile's/native
  c.numerics.profile = ''
  c.numerics.conv_format = ''
  c.numerics.dense_format = ''
  c.numerics.batchnorm_group = 0  # 0: BN over the global batch; K: per group of K examples
  c.numerics.gpu_deterministic = False  # --xla_gpu_deterministic_ops
  c.numerics.xla_flags = ''  # further XLA flags ('--xla_a=1 --xla_b=2'), set before JAX starts
  c.numerics.conv_impl = 'auto'  # 'xla', 'im2col' or 'auto' (im2col where XLA:CPU is slow)
  c.numerics.emulate_impl = 'auto'  # 'reference', 'fast' (native units) or 'auto' (fast off CPU)

  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = 'auto'  # 'auto' (cluster env detected), 'yes' or 'no'
  # Name the job explicitly (e.g. 2 processes on localhost); empty/0/-1: read from the environment.
  c.distributed.coordinator_address = ''  # 'host:port' of process 0
  c.distributed.num_processes = 0
  c.distributed.process_id = -1
  c.preset = ''  # the presets named after the colon, in order (set by `build`)
  c.lock()
  return c


def init_seed_of(config):
  """The seed of the run's initial weights: config.init_seed, or config.seed where it is None."""
  return int(config['seed'] if config.get('init_seed') is None else config['init_seed'])


def data_seed_of(config):
  """The seed of the data order, flips and product noise: config.data_seed, or else config.seed."""
  return int(config['seed'] if config.get('data_seed') is None else config['data_seed'])


def parse_arg(arg, presets):
  """Split 'gpu,seed=3,model.width=0.5' into preset names and {key: text} overrides."""
  names, overrides = [], {}
  for item in filter(None, (s.strip() for s in (arg or '').split(','))):
    if '=' in item:
      key, value = item.split('=', 1)
      key = key.strip()
      if overrides.get(key, value) != value:  # the later would silently win
        raise ValueError(
          f'{key} is given twice after the colon ({overrides[key]} and {value}): give it once'
        )
      overrides[key] = value
    elif item in presets and not item.startswith('_'):
      names.append(item)
    else:
      names_ok = sorted(p for p in presets if not p.startswith('_'))
      raise ValueError(
        f'unknown preset {item!r} after the colon: choose from {names_ok} or give key=value'
      )
  return names, overrides


def fields(config, prefix=''):
  """Every dotted leaf field name of a ConfigDict (or dict)."""
  out = []
  for key, value in config.items():
    name = f'{prefix}{key}'
    out.extend(fields(value, name + '.') if hasattr(value, 'items') else [name])
  return out


def unknown_field(config, dotted):
  """The one-line error for a field the config lacks (a removed one says what replaced it)."""
  if dotted in REMOVED:
    return ValueError(f'config.{dotted}: {REMOVED[dotted]}')
  close = difflib.get_close_matches(dotted, fields(config), n=1)
  hint = f'did you mean {close[0]}?' if close else 'see configs/common.py for the fields'
  return ValueError(f'unknown config field {dotted}: {hint}')


def _literal(text):
  """The Python literal that `text` spells (surrounding spaces aside), or `text` itself."""
  try:
    return ast.literal_eval(text.strip())
  except (ValueError, SyntaxError):
    return text


def typed(old, value, dotted):
  """`value` (text, or already a value) as the type of the field's `old`: a bool, a Python literal
  for numbers and tuples (a bare string: a 1-tuple), any text for a string."""
  if isinstance(old, tuple) and isinstance(value, (list, str)):
    if isinstance(value, str):
      value = _literal(value)
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
  if not isinstance(value, str) or isinstance(old, str):
    return value
  text = value.strip()
  if isinstance(old, bool):
    if text.lower() in TRUE + FALSE:
      return text.lower() in TRUE
    raise ValueError(f'config.{dotted}={value}: give True or False')
  parsed = _literal(text)
  if isinstance(old, (int, float)) and not isinstance(parsed, (int, float)):
    raise ValueError(f'config.{dotted}={value}: give a number ({type(old).__name__})')
  if isinstance(old, int) and isinstance(parsed, float):
    raise ValueError(f'config.{dotted}={value}: give an integer')
  return parsed


def apply_overrides(config, overrides):
  """config[field] = value for each (dotted field, value) pair, typed like its field; config."""
  for dotted, value in overrides:
    if dotted not in fields(config):
      raise unknown_field(config, dotted)
    parent, _, leaf = dotted.rpartition('.')
    node = config[parent] if parent else config
    value = typed(node[leaf], value, dotted)
    try:
      config.update_from_flattened_dict({dotted: value})
    except TypeError as e:
      raise ValueError(
        f'config.{dotted}={value!r}: give a {node.get_type(leaf).__name__}, like the '
        f'default {node[leaf]!r}'
      ) from e
  return config


def build(arg, presets):
  """Apply `arg`'s presets (functions taking the config) in order, then its key=value pairs."""
  names, overrides = parse_arg(arg, presets)
  config = presets['__base__']()
  for name in names:
    presets[name](config)
  apply_overrides(config, overrides.items())
  config.preset = ','.join(names)
  return config


# Not ml_collections.config_flags: its errors are tracebacks, it types overrides otherwise, and the
# sweeps load configs without flags (docs/configs.md).
def split_spec(spec):
  """'configs/digits.py:cpu,seed=3' -> (absolute path, 'cpu,seed=3'); the path ends at '.py:'."""
  spec = spec or ''
  cut = spec.find('.py:')
  path, arg = (spec[: cut + 3], spec[cut + 4 :]) if cut >= 0 else (spec, '')
  if not path.endswith('.py'):
    raise ValueError(f'--config={spec}: give a config file, e.g. --config=configs/digits.py:cpu')
  full = os.path.abspath(path)
  if not os.path.isfile(full):
    full = os.path.join(REPO, path)  # an absolute `path` stays itself
  if not os.path.isfile(full):
    raise ValueError(f'--config: no file {path}; give a config file such as configs/digits.py')
  return full, arg


def load_module(path):
  """Import a config file by path (the repository on sys.path for `from configs import ...`)."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  spec = importlib.util.spec_from_file_location(
    f'config_{os.path.splitext(os.path.basename(path))[0]}_{abs(hash(path))}', path
  )
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ValueError(f'--config: {path} line {e.lineno}: {e.msg}; fix the config file') from e
  except Exception as e:  # e.g. an import the file makes fails
    raise ValueError(
      f'--config: {path}: {type(e).__name__}: {(str(e).splitlines() or [""])[0]}; '
      'fix the config file'
    ) from e
  if not hasattr(module, 'get_config'):
    raise ValueError(f'--config: {path} defines no get_config(arg); see configs/digits.py')
  return module


def load(spec, overrides=()):
  """The ConfigDict of `spec` ('FILE[:ARG]') with `overrides` ([(field, text)]) applied."""
  overrides, seen = list(overrides), {}
  for key, value in overrides:
    if seen.setdefault(key, value) != value:
      raise ValueError(f'--config.{key} is given twice ({seen[key]} and {value}): give it once')
  path, arg = split_spec(spec)
  module = load_module(path)
  try:
    config = module.get_config(arg or None)
  except ValueError as e:
    raise ValueError(f'--config={spec}: {str(e).splitlines()[0]}') from e
  except AttributeError as e:  # a preset setting a field the locked config does not have
    text = str(e)  # ml_collections: 'Key "x" does not exist ... the config is locked'
    name = text.split('Key "', 1)[-1].split('"', 1)[0] if 'Key "' in text else text.splitlines()[0]
    raise ValueError(
      f'--config={spec}: the config file sets a field that does not exist ({name}); see '
      'configs/common.py for the fields'
    ) from e
  except Exception as e:  # the config file's own code failed
    first = (str(e).splitlines() or [''])[0]
    raise ValueError(
      f'--config={spec}: {type(e).__name__}: {first}; fix the config file or the value given'
    ) from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
      f'--config={spec}: get_config() returned a {type(config).__name__}, not an '
      'ml_collections.ConfigDict: build it as configs/digits.py does'
    )
  return apply_overrides(config, overrides)


def split_argv(argv):
  """(spec, [(field, text)], other args) of a command line's --config and --config.<field> flags."""
  spec, overrides, rest, i = None, [], [], 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith('--config.'):
      key, eq, value = arg[len('--config.') :].partition('=')
      if not eq and i + 1 < len(argv):
        i, value = i + 1, argv[i + 1]
      overrides.append((key, value))
    elif arg == '--config' and i + 1 < len(argv):
      i, spec = i + 1, argv[i + 1]
    elif arg.startswith('--config='):
      spec = arg[len('--config=') :]
    else:
      rest.append(arg)
    i += 1
  return spec, overrides, rest
