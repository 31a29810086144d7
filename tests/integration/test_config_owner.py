"""configs/ owns the config: resolution and every check that needs no device or data run without
JAX or the trainer; checks that once waited for the trainer now answer at resolution; and a new
dataset is one module plus its config (input_pipeline/__init__.py), found, checked, declared for
a compile-only build and trained without editing any other file."""

import os
import subprocess
import sys

import pytest

import input_pipeline
from configs import common, validation
from tests.conftest import ROOT
from trainer import run, train

HEAVY = (
  'jax',
  'jaxlib',
  'flax',
  'optax',
  'orbax',
  'sklearn',
  'scipy',
  'tensorflow',
  'tensorflow_datasets',
  'torch',
  'pandas',
  'matplotlib',
)


@pytest.mark.parametrize(
  'spec',
  [
    'configs/digits.py:smoke',
    'configs/celeba.py:tpu',
    'configs/digits.py:smoke,model.name=resnet50',
  ],
)
def test_resolving_a_config_loads_no_jax_and_no_trainer(spec):
  """Before: resolving (then in the trainer's validation module) imported the trainer, flax,
  optax and orbax to check a config (the sweep did so for every arm)."""
  code = f'from configs import common, validation; validation.resolve(common.load({spec!r}))'
  proc = subprocess.run(
    [sys.executable, '-X', 'importtime', '-c', code],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, 'PYTHONPATH': ROOT},
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  modules = {
    line.rsplit('|', 1)[-1].strip()
    for line in proc.stderr.splitlines()
    if line.startswith('import time:')
  }
  assert sorted({m.split('.')[0] for m in modules} & set(HEAVY)) == []
  assert sorted(m for m in modules if m.startswith(('trainer', 'models.resnet', 'sweeps'))) == []


def smoke(**overrides):
  return common.load('configs/digits.py:smoke', list(overrides.items()))


@pytest.mark.parametrize(
  'field, value, message',
  [
    ('model.name', 'resnet999', "config.model.name='resnet999': no model module models.resnet999"),
    ('model.name', 'my_models.nope', "config.model.name='my_models.nope': no model module"),
    ('distributed.initialize', 'maybe', "config.distributed.initialize must be one of ('auto'"),
    ('data.name', 'mnist', "config.data.name must be one of ('celeba', 'digits')"),
    ('model.stem', 'tiny', "config.model.stem must be one of ('imagenet', 'small')"),
  ],
)
def test_checks_that_waited_for_the_trainer_answer_at_resolution(field, value, message):
  """Before: model.name was refused while the model was built, distributed.initialize after the
  XLA flags were set, data.name by the dataset loader; now all at resolution, one line."""
  with pytest.raises(validation.ConfigError) as error:
    validation.resolve(smoke(**{field: value}))
  assert str(error.value).startswith(message) and '\n' not in str(error.value)


def test_device_checks_are_free_functions_of_numbers():
  """Batch divisibility given a device count and the activation bound given device memory, with
  no device; a training split given its size."""
  config = validation.resolve(smoke())
  validation.check_devices(config, 8, 1, None)
  with pytest.raises(
    validation.ConfigError, match=f'config.batch_size={config.batch_size} is not divisible by the 3'
  ):
    validation.check_devices(config, 3, 1, None)
  with pytest.raises(validation.ConfigError, match='a training step keeps at least'):
    validation.check_devices(config, 8, 1, 1000)  # 1000 bytes a device
  with pytest.raises(validation.ConfigError, match='larger than the 31 training examples'):
    validation.check_dataset(config, 31, 0)


TINY = '''"""A generated dataset: 96 8x8 RGB images of 4 classes, each class a brightness band."""
import numpy as np
import input_pipeline
IMAGES, CLASSES = 96, 4

def split_sizes(data):
  test = int(IMAGES * float(data.test_fraction))
  return IMAGES - test, test

def load(config):
  rng = np.random.default_rng(int(config.data.split_seed))
  labels = np.arange(IMAGES, dtype=np.int32) % CLASSES
  size = int(config.data.image_size)
  noise = rng.integers(0, 40, (IMAGES, size, size, 3))
  images = (labels[:, None, None, None] * 60 + noise).astype(np.uint8)
  train, test = split_sizes(config.data)
  return input_pipeline.Dataset('tiny', input_pipeline.Split(images[:train], labels[:train]),
                                input_pipeline.Split(images[train:], labels[train:]), CLASSES,
                                info={'train_size': train, 'test_size': test})

DATASET = input_pipeline.Declaration(name='tiny', images=IMAGES, channels=3,
                                     split_sizes=split_sizes,
                                     labels=lambda data: (CLASSES, 'classification', ()),
                                     load=load, tasks=('bands',))
'''
TINY_CONFIG = """from configs import common

def base():
  c = common.base_config()
  c.data.name, c.data.task, c.data.image_size = 'tiny', 'bands', 8
  c.model.stem, c.model.width = 'small', 0.125
  c.batch_size, c.eval_batch_size, c.num_epochs, c.log_every_steps = 16, 32, 2, 2
  c.optim.freeze_epochs, c.optim.warmup_epochs = 1, 0.5
  return c

PRESETS = {'__base__': base}

def get_config(arg=None):
  return common.build(arg, PRESETS)
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch):
  """A dataset module `tiny` and its config file, written to a folder of their own that the
  input_pipeline package also searches: the repository stays untouched."""
  (tmp_path / 'tiny.py').write_text(TINY)
  (tmp_path / 'tiny_config.py').write_text(TINY_CONFIG)
  monkeypatch.setattr(input_pipeline, '__path__', [*input_pipeline.__path__, str(tmp_path)])
  monkeypatch.delitem(sys.modules, 'input_pipeline.tiny', raising=False)
  yield str(tmp_path / 'tiny_config.py')
  sys.modules.pop('input_pipeline.tiny', None)


def test_a_new_dataset_is_one_module_and_its_config(tiny, tmp_path):
  """Found by the registry, its own task checked at resolution, declared without data for a
  compile-only build, and trained and evaluated: no other file edited."""
  assert 'tiny' in input_pipeline.names()
  with pytest.raises(
    validation.ConfigError,
    match=r"config.data.task must be one of \('bands',\) "
    'for tiny',
  ):
    validation.resolve(common.load(f'{tiny}:data.task=identity'))
  config = validation.resolve(common.load(tiny))
  declared = input_pipeline.declared(config)
  assert (len(declared.train), len(declared.test), declared.image_shape) == (77, 19, (8, 8, 3))
  ctx = run.build(config, declared)
  assert ctx.per_epoch == 77 // 16 and ctx.dataset.num_classes == 4
  results = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert results['status'] == 'completed' and results['config']['data']['name'] == 'tiny'
  assert results['data']['test_size'] == 19 and results['data']['num_classes'] == 4
  assert results['final']['test_accuracy'] > 0.25  # four bands of brightness: above chance
