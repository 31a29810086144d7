"""The one way a config is loaded: a file, its presets and key=value pairs, then overrides.

  config = loader.load('configs/celeba.py:gpu,seed=3', [('optim.learning_rate', '0.003')])

`spec` is `FILE[:ARG]`: FILE a config file defining `get_config(arg)` (configs/common.py builds it
from presets and `key=value` pairs), ARG the text after the colon. `overrides` are (dotted field,
value) pairs applied afterwards, as the command line's `--config.<field>=<value>` flags are; a
value given as text is read as the field's type (`True`/`false`/`1` for booleans, Python literals
for numbers and tuples, anything for strings). train.py, the sweep, the study, the divergence tool
and the benchmarks all load through `load`; a bad file, preset, field or value raises one-line
ValueError naming it and the fix. The numerics product formats are expanded after the overrides
(numerics/profiles.py: the profile / emulate shorthands written out as conv_format and
dense_format; contradictory settings are an error), also when overrides are applied to a config
already loaded: a new shorthand then replaces the formats the old one had set.
"""

import ast
import difflib
import importlib.util
import os
import sys

from configs import common
from numerics import profiles

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUE, FALSE = ('true', '1', 'yes'), ('false', '0', 'no')


def split_spec(spec):
  """'configs/digits.py:cpu,seed=3' -> (absolute file path, 'cpu,seed=3')."""
  path, _, arg = (spec or '').partition(':')
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
      f'config_{os.path.splitext(os.path.basename(path))[0]}_{abs(hash(path))}', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ValueError(f'--config: {path} line {e.lineno}: {e.msg}; fix the config file') from None
  if not hasattr(module, 'get_config'):
    raise ValueError(f'--config: {path} defines no get_config(arg); see configs/digits.py')
  return module


def fields(config, prefix=''):
  """Every dotted leaf field name of a ConfigDict (or dict)."""
  out = []
  for key, value in config.items():
    name = f'{prefix}{key}'
    out.extend(fields(value, name + '.') if hasattr(value, 'items') else [name])
  return out


def unknown_field(config, dotted):
  close = difflib.get_close_matches(dotted, fields(config), n=1)
  hint = f'did you mean {close[0]}?' if close else 'see configs/common.py for the fields'
  return ValueError(f'unknown config field {dotted}: {hint}')


def typed(old, value, dotted):
  """`value` (text from a command line, or already a value) as the type of the field's `old`."""
  if not isinstance(value, str) or isinstance(old, str):
    return value
  text = value.strip()
  if isinstance(old, bool):
    if text.lower() in TRUE + FALSE:
      return text.lower() in TRUE
    raise ValueError(f'config.{dotted}={value}: give True or False')
  try:
    parsed = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    parsed = text
  if isinstance(old, (int, float)) and not isinstance(parsed, (int, float)):
    raise ValueError(f'config.{dotted}={value}: give a number ({type(old).__name__})')
  if isinstance(old, int) and isinstance(parsed, float):
    raise ValueError(f'config.{dotted}={value}: give an integer')
  return parsed


def apply_overrides(config, overrides):
  """config[field] = value for each (dotted field, value) pair, typed like the field; then the
  product formats expanded (numerics/profiles.py)."""
  overrides = list(overrides)
  profiles.release(config, [dotted for dotted, _ in overrides])
  for dotted, value in overrides:
    node = config
    *parents, leaf = dotted.split('.')
    for name in parents:
      if name not in node or not hasattr(node[name], 'items'):
        raise unknown_field(config, dotted)
      node = node[name]
    if leaf not in node:
      raise unknown_field(config, dotted)
    common.set_field(config, dotted, typed(node[leaf], value, dotted))
  return profiles.expand(config) if 'numerics' in config else config


def load(spec, overrides=()):
  """The ConfigDict of `spec` ('FILE[:ARG]') with `overrides` applied (module docstring)."""
  path, arg = split_spec(spec)
  module = load_module(path)
  try:
    config = module.get_config(arg or None)
  except ValueError as e:
    raise ValueError(f'--config={spec}: {str(e).splitlines()[0]}') from None
  return apply_overrides(config, overrides)


def split_argv(argv):
  """(spec, [(field, text)], other args) from a command line with `--config=SPEC` (or
  `--config SPEC`) and `--config.<field>=<value>` flags, as train.py takes them."""
  spec, overrides, rest, i = None, [], [], 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith('--config.'):
      key, eq, value = arg[len('--config.'):].partition('=')
      if not eq and i + 1 < len(argv):
        i, value = i + 1, argv[i + 1]
      overrides.append((key, value))
    elif arg == '--config' and i + 1 < len(argv):
      i, spec = i + 1, argv[i + 1]
    elif arg.startswith('--config='):
      spec = arg[len('--config='):]
    else:
      rest.append(arg)
    i += 1
  return spec, overrides, rest
