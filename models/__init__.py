"""The models, one module each, found by `config.model.name`: a plain name is `models.<name>`
(models/resnet18.py, models/resnet50.py), a dotted name is imported as given (a researcher's
`my_models.tiny` on PYTHONPATH). A model module exports:

  create(config, num_classes, in_channels, rngs) -> nnx.Module   NHWC float images -> f32 logits,
      built from models/layers.py's layers (their products follow config.numerics)
  PARTS: {part: top-level attribute names}   what model.reinit names and a frozen phase trains
  activation_values(config) -> (train, eval)   values per example, lower bounds (the memory check)
  torch_keys(model) -> {torchvision key: (Variable, to_nnx)}   optional: model.init_from loads by it
  TORCHVISION: str   optional: the torchvision architecture its weights are (e.g. 'ResNet-50')

Resolving a config checks that the module exists (no JAX loaded); `get` checks the contract when
the model is built. See docs/configs.md ("Adding a model").
"""

import importlib
import importlib.util

REQUIRED = ('create', 'PARTS', 'activation_values')


def module_name(name):
  """The module config.model.name `name` selects."""
  return name if '.' in name else f'models.{name}'


def missing(name):
  """One line saying why no module `name` selects can be found (found: None), without importing
  it (its parent packages are)."""
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
  """The model config.model and config.numerics describe, its layers' products traced for
  `platform` (the mesh's; None: JAX's default backend) and named (layers.name_products)."""
  from models import layers

  model = get(config.model.name).create(config, num_classes, in_channels, rngs)
  return layers.name_products(model, platform)
