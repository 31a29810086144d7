"""ResNet-18 in flax.nnx with torchvision's structure, names and parameter shapes.

Attribute paths mirror torchvision's state-dict keys (`conv1`, `bn1`, `layer1.0.conv1`,
`layer2.0.downsample.0`, `fc`), so pretrained weights map one to one. With the ImageNet stem, 3
input channels, width 1 and 1000 classes it has exactly torchvision's 11,689,512 parameters. Its
structure in numbers (stages, stems, parts) is models/architecture.py; the config fields that
shape it: docs/configs.md ("Field groups").
"""

import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from models import pool
from models.architecture import STAGE_BLOCKS, STEMS, stage_channels
from models.layers import BatchNorm, Conv2d, Linear
from numerics import profiles


class BasicBlock(nnx.Module):
  def __init__(self, in_channels, channels, stride, *, layer_kwargs, bn_kwargs, rngs):
    self.conv1 = Conv2d(
      in_channels, channels, 3, stride=stride, padding=1, **layer_kwargs, rngs=rngs
    )
    self.bn1 = BatchNorm(channels, **bn_kwargs)
    self.conv2 = Conv2d(channels, channels, 3, padding=1, **layer_kwargs, rngs=rngs)
    self.bn2 = BatchNorm(channels, **bn_kwargs)
    if stride != 1 or in_channels != channels:
      self.downsample = nnx.List(
        [
          Conv2d(in_channels, channels, 1, stride=stride, **layer_kwargs, rngs=rngs),
          BatchNorm(channels, **bn_kwargs),
        ]
      )
    else:
      self.downsample = None

  def __call__(self, x):
    y = jax.nn.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    shortcut = x if self.downsample is None else self.downsample[1](self.downsample[0](x))
    return jax.nn.relu(y + shortcut)


class ResNet18(nnx.Module):
  """ResNet-18. Input: NHWC float images (already normalised). Output: [N, num_classes] logits.

  stem='imagenet': 7x7/2 conv, BN, ReLU, 3x3/2 max-pool (torchvision). stem='small': 3x3/1 conv,
  BN, ReLU, no pooling, for tiny images (8-32 px). `width` multiplies every stage's channels.
  `conv_impl` ('auto', 'xla', 'im2col'; numerics/ops.py) picks how the convolutions are computed.
  Product formats: `conv_format` for every convolution, `dense_format` for the head ('native' or
  a numerics/emulate.py format). Every Conv2d and Linear gets a
  static `product_id`, the CRC-32 of its torchvision name, for its noise key (numerics/ops.py).
  `batchnorm_group` > 0 gives every BatchNorm per-group statistics (see `layers.BatchNorm`).
  """

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
    layer_kwargs = dict(
      dtype=dtype,
      param_dtype=param_dtype,
      fmt=conv_format,
      conv_impl=conv_impl,
      emulate_impl=emulate_impl,
    )
    bn_kwargs = dict(dtype=dtype, param_dtype=param_dtype, group_size=batchnorm_group)
    channels = stage_channels(width)
    self.stem = stem
    if stem == 'imagenet':
      self.conv1 = Conv2d(
        in_channels, channels[0], 7, stride=2, padding=3, **layer_kwargs, rngs=rngs
      )
    else:
      self.conv1 = Conv2d(
        in_channels, channels[0], 3, stride=1, padding=1, **layer_kwargs, rngs=rngs
      )
    self.bn1 = BatchNorm(channels[0], **bn_kwargs)
    stages, previous = [], channels[0]
    for index, (c, blocks) in enumerate(zip(channels, STAGE_BLOCKS, strict=True)):
      stride = 1 if index == 0 else 2
      stage = []
      for b in range(blocks):
        stage.append(
          BasicBlock(
            previous,
            c,
            stride if b == 0 else 1,
            layer_kwargs=layer_kwargs,
            bn_kwargs=bn_kwargs,
            rngs=rngs,
          )
        )
        previous = c
      stages.append(nnx.List(stage))
    self.layer1, self.layer2, self.layer3, self.layer4 = stages
    self.fc = Linear(
      previous,
      num_classes,
      dtype=dtype,
      param_dtype=param_dtype,
      fmt=dense_format,
      emulate_impl=emulate_impl,
      rngs=rngs,
    )
    self.dtype = dtype
    for path, module in nnx.iter_modules(self):
      if isinstance(module, (Conv2d, Linear)):
        module.product_id = product_id(path)

  def features(self, x):
    x = jax.nn.relu(self.bn1(self.conv1(x.astype(self.dtype))))
    if self.stem == 'imagenet':
      x = pool.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))  # nnx.max_pool's values, no scatter
    for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
      for block in stage:
        x = block(x)
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))  # global average pool, f32

  def __call__(self, x):
    return self.fc(self.features(x)).astype(jnp.float32)


def product_id(path):
  """A layer's static noise id: the CRC-32 of its torchvision name ('layer2.0.downsample.0'),
  31 bits."""
  return zlib.crc32('.'.join(map(str, path)).encode()) & 0x7FFFFFFF


def count_params(model):
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def create_model(config, num_classes, in_channels, rngs):
  """The model `config.model` and `config.numerics` describe (a resolved config: its model.name
  is one of architecture.NAMES, its stem one of architecture.STEMS)."""
  model_cfg, num_cfg = config.model, config.numerics
  formats = profiles.formats(num_cfg)
  return ResNet18(
    num_classes,
    in_channels=in_channels,
    width=float(model_cfg.width),
    stem=model_cfg.stem,
    dtype=jnp.dtype(num_cfg.compute_dtype),
    param_dtype=jnp.dtype(num_cfg.param_dtype),
    conv_format=formats['conv'],
    dense_format=formats['dense'],
    batchnorm_group=int(num_cfg.batchnorm_group),
    conv_impl=num_cfg.get('conv_impl', 'auto'),
    emulate_impl=num_cfg.get('emulate_impl', 'auto'),
    rngs=rngs,
  )
