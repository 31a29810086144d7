"""What a config needs in memory, checked before any data is loaded or anything compiled: a
training step's activations (from image size, batch, width and dtype) and the digits resized."""

import jax.numpy as jnp
import pytest
from flax import nnx

import input_pipeline
from configs import celeba, digits, validation
from input_pipeline import digits as digits_data
from models import layers, resnet

GIB = 2**30


@pytest.mark.parametrize('net, convs', [(resnet.ResNet18, 20), (resnet.ResNet50, 53)])
@pytest.mark.parametrize(
  'stem,size,width',
  [('imagenet', 64, 0.125), ('imagenet', 37, 0.25), ('small', 8, 0.125), ('small', 13, 0.5)],
)
def test_activation_values_count_what_the_model_computes(
  net, convs, stem, size, width, monkeypatch
):
  seen = []
  call = layers.Conv2d.__call__
  monkeypatch.setattr(
    layers.Conv2d, '__call__', lambda self, x: seen.append(call(self, x)) or seen[-1]
  )
  nnx.eval_shape(
    lambda: net(10, width=width, stem=stem, rngs=nnx.Rngs(0))(jnp.zeros((1, size, size, 3)))
  )  # shapes only: nothing computed
  assert len(seen) == convs  # the stem, the blocks' convolutions, 3 (ResNet-50: 4) downsamples
  config = digits.get_config('smoke')
  config.data.image_size, config.model.width, config.model.stem = size, width, stem
  train, evaluate = net.activation_values(config)
  assert train == sum(y.size for y in seen)
  assert evaluate == seen[0].size + size * size  # the first convolution's output and its input


def test_activation_check_refuses_what_cannot_fit_with_its_numbers():
  config = celeba.get_config('gpu')  # 224 px, batch 2048, width 1.0, float32
  per_image = resnet.ResNet18.activation_values(config)[0] * 4
  validation.check_activations(config, 8, 80 * GIB, None)  # 256 per H100: fits
  with pytest.raises(validation.ConfigError) as e:
    validation.check_activations(config, 1, 16 * GIB, None)
  assert str(e.value) == (
    f'config.data.image_size=224: a training step keeps at least {2048 * per_image / GIB:.1f} '
    f'GiB of activations (2048 images x {per_image / 2**20:.1f} MiB of convolution outputs at '
    '224x224, model.width 1, float32), over the 16.0 GiB a device has: use a smaller '
    'config.data.image_size or config.batch_size'
  )
  config.numerics.compute_dtype = 'bfloat16'  # half the bytes: fits in 16 GiB on 2 devices
  validation.check_activations(config, 2, 16 * GIB, None)
  # CPU devices report no memory: the whole batch against the host's memory.
  small = digits.get_config('smoke')
  validation.check_activations(small, 8, None, 1 * GIB)
  small.data.image_size = 1024
  with pytest.raises(
    validation.ConfigError,
    match=r'at least 18\.8 GiB .* over the 1\.0 GiB this '
    'machine has',
  ):
    validation.check_activations(small, 8, None, 1 * GIB)


def test_digits_resized_beyond_memory_are_refused_before_resizing(monkeypatch):
  config = digits.get_config('smoke')
  config.data.image_size = 600
  monkeypatch.setattr(input_pipeline, 'host_memory', lambda: GIB)
  monkeypatch.setattr(digits_data, '_resize', lambda *a: pytest.fail('resized before the check'))
  with pytest.raises(
    ValueError,
    match=r'^config.data.image_size=600: the 1797 digits resized to '
    r'600x600 take 0\.6 GiB of memory, over half of the 1\.0 GiB this machine',
  ):
    digits_data.load(config)
