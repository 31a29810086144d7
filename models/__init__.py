"""The models, one module each, found by `config.model.name`: `models.<name>`, or a dotted module
path imported as given. A model module exports `create`, `PARTS` and `activation_values` (and for
`model.init_from`, `torch_keys` and `TORCHVISION`): docs/configs.md, "Adding a model"."""

import importlib
import importlib.util

REQUIRED = ('create', 'PARTS', 'activation_values')
STEMS = ('imagenet', 'small')  # model.stem of the ResNets (models/resnet.py)


def module_name(name):
  """The module config.model.name `name` selects."""
  return name if '.' in name else f'models.{name}'


def missing(name):
  """One line saying why no module `name` selects is found (found: None), without importing it."""
  if not (isinstance(name, str) and all(p.isidentifier() for p in name.split('.'))):
    return f'config.model.name={name!r} is not a module name (e.g. resnet18, my_models.tiny)'
  try:
    found = importlib.util.find_spec(module_name(name)) is not None
  except ModuleNotFoundError:  # a parent package of a dotted name is missing
    found = False
  if found:
    return None
  return (
    f'config.model.name={name!r}: no model module {module_name(name)}: name a module in models/ '
    '(resnet18, resnet50) or a dotted module on PYTHONPATH (my_models.tiny)'
  )


def get(name):
  """The model module `name` selects, its contract checked (ValueError: one line)."""
  problem = missing(name)
  if problem:
    raise ValueError(problem)
  module = importlib.import_module(module_name(name))
  lacks = [attr for attr in REQUIRED if not hasattr(module, attr)]
  if lacks:
    raise ValueError(
      f'config.model.name={name!r}: {module.__name__} lacks {", ".join(lacks)} (a model module '
      'exports create, PARTS and activation_values: see models/__init__.py)'
    )
  return module


def build(config, num_classes, in_channels, rngs, platform=None):
  """The model of config.model and config.numerics, its products traced for `platform` and named."""
  from models import layers

  model = get(config.model.name).create(config, num_classes, in_channels, rngs)
  return layers.name_products(model, platform)
