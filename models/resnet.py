"""torchvision's ResNets in flax.nnx: ResNet-18 (basic blocks) and ResNet-50 (bottlenecks), with
torchvision's structure, attribute names (= state-dict keys), shapes and initialisation."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import STEMS, layers
from models.layers import BatchNorm, Conv2d, Linear
from numerics import formats

STAGE_CHANNELS = (64, 128, 256, 512)
PARTS = {'stem': ('conv1', 'bn1'), 'head': ('fc',)}  # for model.reinit and the frozen phase


def stage_channels(width):
  """The four stages' channel counts at `width` (at least 1 each)."""
  return [max(1, int(round(c * width))) for c in STAGE_CHANNELS]


def _downsample(in_channels, out_channels, stride, layer_kwargs, bn_kwargs, rngs):
  """torchvision's shortcut where the shape changes: 1x1 conv (strided) + BN; else None."""
  if stride == 1 and in_channels == out_channels:
    return None
  return nnx.List(
    [
      Conv2d(in_channels, out_channels, 1, stride=stride, **layer_kwargs, rngs=rngs),
      BatchNorm(out_channels, **bn_kwargs),
    ]
  )


def _shortcut(block, x):
  return x if block.downsample is None else block.downsample[1](block.downsample[0](x))


class BasicBlock(nnx.Module):
  """Two 3x3 convolutions (the first strided) and the shortcut."""

  expansion = 1

  def __init__(self, in_channels, channels, stride, *, layer_kwargs, bn_kwargs, rngs):
    self.conv1 = Conv2d(
      in_channels, channels, 3, stride=stride, padding=1, **layer_kwargs, rngs=rngs
    )
    self.bn1 = BatchNorm(channels, **bn_kwargs)
    self.conv2 = Conv2d(channels, channels, 3, padding=1, **layer_kwargs, rngs=rngs)
    self.bn2 = BatchNorm(channels, **bn_kwargs)
    self.downsample = _downsample(in_channels, channels, stride, layer_kwargs, bn_kwargs, rngs)

  def __call__(self, x):
    y = jax.nn.relu(self.bn1(self.conv1(x)))
    return jax.nn.relu(self.bn2(self.conv2(y)) + _shortcut(self, x))

  @staticmethod
  def conv_values(size, out_size, in_channels, channels):
    """Values per example of the block's convolution outputs (conv1, conv2, downsample)."""
    down = out_size != size or in_channels != channels
    return (2 + down) * out_size * out_size * channels


class Bottleneck(nnx.Module):
  """torchvision's Bottleneck (ResNet V1.5): 1x1, strided 3x3, 1x1 to 4x the channels, shortcut."""

  expansion = 4

  def __init__(self, in_channels, channels, stride, *, layer_kwargs, bn_kwargs, rngs):
    out = channels * self.expansion
    self.conv1 = Conv2d(in_channels, channels, 1, **layer_kwargs, rngs=rngs)
    self.bn1 = BatchNorm(channels, **bn_kwargs)
    self.conv2 = Conv2d(channels, channels, 3, stride=stride, padding=1, **layer_kwargs, rngs=rngs)
    self.bn2 = BatchNorm(channels, **bn_kwargs)
    self.conv3 = Conv2d(channels, out, 1, **layer_kwargs, rngs=rngs)
    self.bn3 = BatchNorm(out, **bn_kwargs)
    self.downsample = _downsample(in_channels, out, stride, layer_kwargs, bn_kwargs, rngs)

  def __call__(self, x):
    y = jax.nn.relu(self.bn1(self.conv1(x)))
    y = jax.nn.relu(self.bn2(self.conv2(y)))
    return jax.nn.relu(self.bn3(self.conv3(y)) + _shortcut(self, x))

  @staticmethod
  def conv_values(size, out_size, in_channels, channels):
    """Values per example of the block's convolution outputs (conv1..3, downsample)."""
    out = channels * 4
    down = out_size != size or in_channels != out
    return size * size * channels + out_size * out_size * (channels + out + down * out)


class ResNet(nnx.Module):
  """A torchvision ResNet of BLOCKs, STAGES per stage (the subclasses say which)."""

  BLOCK: Any  # BasicBlock or Bottleneck
  STAGES: tuple[int, ...]

  def __init__(
    self,
    num_classes=1000,
    *,
    in_channels=3,
    width=1.0,
    stem='imagenet',
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    conv_format='native',
    dense_format='native',
    batchnorm_group=0,
    conv_impl='auto',
    emulate_impl='auto',
    rngs: nnx.Rngs,
  ):
    if stem not in STEMS:  # a config's stem is checked at resolution (configs/validation.py)
      raise ValueError(f'stem must be one of {STEMS}, got {stem!r}')
    numerics = dict(dtype=dtype, param_dtype=param_dtype, emulate_impl=emulate_impl)
    layer_kwargs = dict(numerics, fmt=conv_format, conv_impl=conv_impl)
    bn_kwargs = dict(dtype=dtype, param_dtype=param_dtype, group_size=batchnorm_group)
    channels = stage_channels(width)
    self.stem, self.dtype = stem, dtype
    kernel, stride, padding = (7, 2, 3) if stem == 'imagenet' else (3, 1, 1)
    self.conv1 = Conv2d(
      in_channels, channels[0], kernel, stride=stride, padding=padding, **layer_kwargs, rngs=rngs
    )
    self.bn1 = BatchNorm(channels[0], **bn_kwargs)
    stages, previous = [], channels[0]
    block = self.BLOCK
    for index, (c, blocks) in enumerate(zip(channels, self.STAGES, strict=True)):
      stage = []
      for b in range(blocks):
        stride = 2 if index and not b else 1
        stage.append(
          block(previous, c, stride, layer_kwargs=layer_kwargs, bn_kwargs=bn_kwargs, rngs=rngs)
        )
        previous = c * block.expansion
      stages.append(nnx.List(stage))
    self.layer1, self.layer2, self.layer3, self.layer4 = stages
    self.fc = Linear(previous, num_classes, **numerics, fmt=dense_format, rngs=rngs)
    layers.name_products(self)

  def features(self, x):
    x = jax.nn.relu(self.bn1(self.conv1(x.astype(self.dtype))))
    if self.stem == 'imagenet':
      x = layers.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
    for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
      for block in stage:
        x = block(x)
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))  # global average pool, f32

  def __call__(self, x):
    return self.fc(self.features(x)).astype(jnp.float32)

  @classmethod
  def create(cls, config, num_classes, in_channels, rngs):
    """The registry's `create`: this ResNet of a resolved config."""
    return cls(num_classes, in_channels=in_channels, rngs=rngs, **options(config))

  @classmethod
  def activation_values(cls, config):
    """(train, eval) values per example, lower bounds: all conv outputs; the first conv's in+out."""
    image, width, stem = config.data.image_size, float(config.model.width), config.model.stem
    channels = stage_channels(width)
    size = _conv_out(image, 7, 2, 3) if stem == 'imagenet' else image
    first = size * size * channels[0]
    total = first
    if stem == 'imagenet':
      size = _conv_out(size, 3, 2, 1)  # the max-pool
    previous = channels[0]
    for index, (c, blocks) in enumerate(zip(channels, cls.STAGES, strict=True)):
      for b in range(blocks):
        out_size = _conv_out(size, 3, 2 if index and not b else 1, 1)
        total += cls.BLOCK.conv_values(size, out_size, previous, c)
        size, previous = out_size, c * cls.BLOCK.expansion
    return total, first + image * image


class ResNet18(ResNet):
  """torchvision's resnet18: basic blocks, 2 per stage."""

  BLOCK, STAGES = BasicBlock, (2, 2, 2, 2)


class ResNet50(ResNet):
  """torchvision's resnet50: bottleneck blocks, (3, 4, 6, 3) per stage."""

  BLOCK, STAGES = Bottleneck, (3, 4, 6, 3)


def options(config):
  """ResNet's keyword arguments from a resolved config.model and config.numerics."""
  m, n = config.model, config.numerics
  requested = formats.kind_formats(n)
  return dict(
    width=float(m.width),
    stem=m.stem,
    dtype=jnp.dtype(n.compute_dtype),
    param_dtype=jnp.dtype(n.param_dtype),
    conv_format=requested['conv'],
    dense_format=requested['dense'],
    batchnorm_group=int(n.batchnorm_group),
    conv_impl=n.conv_impl,
    emulate_impl=n.emulate_impl,
  )


def _conv_out(size, kernel, stride, padding):
  return (size + 2 * padding - kernel) // stride + 1
