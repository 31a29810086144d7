"""The one way a config is loaded: a file, its presets and key=value pairs, then overrides.

  config = loader.load('configs/celeba.py:gpu,seed=3', [('optim.learning_rate', '0.003')])

`spec` is `FILE[:ARG]`: a config file defining `get_config(arg)` (configs/common.py builds it from
presets and `key=value` pairs) and the text after the colon; `overrides` are (dotted field, value)
pairs applied afterwards, as train.py's `--config.<field>=<value>` flags are. A bad file, preset,
field or value is a one-line ValueError naming it and the fix. The result is the config as written;
the entry point resolves it once (configs/validation.py). Why not `ml_collections.config_flags`:
docs/configs.md ("On the command line").
"""

import importlib.util
import os
import sys

import ml_collections

from configs import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def split_spec(spec):
  """'configs/digits.py:cpu,seed=3' -> (absolute file path, 'cpu,seed=3'). The file is the text
  up to the first '.py:' (or all of it when it ends in '.py'), so a folder name may hold ':'."""
  spec = spec or ''
  cut = spec.find('.py:')
  path, arg = (spec[: cut + 3], spec[cut + 4 :]) if cut >= 0 else (spec, '')
  if not path.endswith('.py'):
    raise ValueError(f'--config={spec}: give a config file, e.g. --config=configs/digits.py:cpu')
  full = path if os.path.isabs(path) else os.path.abspath(path)
  if not os.path.isfile(full):
    full = os.path.join(REPO, path) if not os.path.isabs(path) else full
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
    raise ValueError(f'--config: {path} line {e.lineno}: {e.msg}; fix the config file') from None
  except Exception as e:  # e.g. an import the file makes fails
    raise ValueError(
      f'--config: {path}: {type(e).__name__}: {(str(e).splitlines() or [""])[0]}; '
      'fix the config file'
    ) from None
  if not hasattr(module, 'get_config'):
    raise ValueError(f'--config: {path} defines no get_config(arg); see configs/digits.py')
  return module


def repeated(overrides):
  """A one-line ValueError when a field is given twice among `overrides` ([(field, text)]): the
  later would silently win (`--config.seed=1 ... --config.seed=2`)."""
  seen = {}
  for key, value in overrides:
    if key in seen and seen[key] != value:
      raise ValueError(f'--config.{key} is given twice ({seen[key]} and {value}): give it once')
    seen[key] = value


def load(spec, overrides=()):
  """The ConfigDict of `spec` ('FILE[:ARG]') with `overrides` applied (module docstring); a field
  given twice with two values is refused (`repeated`), here and after the colon."""
  overrides = list(overrides)
  repeated(overrides)
  path, arg = split_spec(spec)
  module = load_module(path)
  try:
    config = module.get_config(arg or None)
  except ValueError as e:
    raise ValueError(f'--config={spec}: {str(e).splitlines()[0]}') from None
  except AttributeError as e:  # a preset setting a field the locked config does not have
    raise ValueError(f'--config={spec}: {_locked_message(e)}') from None
  except Exception as e:  # the config file's own code failed
    first = (str(e).splitlines() or [''])[0]
    raise ValueError(
      f'--config={spec}: {type(e).__name__}: {first}; fix the config file or the value given'
    ) from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
      f'--config={spec}: get_config() returned a {type(config).__name__}, not an '
      'ml_collections.ConfigDict: build it as configs/digits.py does'
    )
  return common.apply_overrides(config, overrides)


def _locked_message(error):
  """The field name of ml_collections' 'Key "x" does not exist ... the config is locked' error."""
  text = str(error)
  name = text.split('Key "', 1)[-1].split('"', 1)[0] if 'Key "' in text else text.splitlines()[0]
  return (
    f'the config file sets a field that does not exist ({name}); see configs/common.py for '
    'the fields'
  )


def split_argv(argv):
  """(spec, [(field, text)], other args) from a command line with `--config=SPEC` (or
  `--config SPEC`) and `--config.<field>=<value>` flags, as train.py takes them."""
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
