"""The layers every model is built from (Conv2d, Linear, BatchNorm with torchvision's initialisation
and names), a scatter-free max pool, and their torchvision state-dict keys (`torch_keys`)."""

import functools
import math
import zlib

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from numerics import ops


class Conv2d(nnx.Module):
  """Bias-free NHWC convolution, kernel HWIO [k, k, in, out] (torch's OIHW, transposed)."""

  def __init__(
    self,
    in_channels,
    out_channels,
    kernel_size,
    *,
    stride=1,
    padding=0,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    fmt='native',
    conv_impl='auto',
    emulate_impl='auto',
    rngs,
  ):
    shape = (kernel_size, kernel_size, in_channels, out_channels)
    # torchvision ResNet: kaiming_normal_(mode='fan_out', nonlinearity='relu').
    std = math.sqrt(2.0 / (out_channels * kernel_size * kernel_size))
    self.kernel = nnx.Param(std * jax.random.normal(rngs.params(), shape, param_dtype))
    self.stride, self.padding = stride, [(padding, padding)] * 2
    self.dtype, self.fmt, self.emulate_impl, self.conv_impl = dtype, fmt, emulate_impl, conv_impl
    self.product_id, self.platform = 0, None  # name_products sets them

  def __call__(self, x):
    return ops.conv2d(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      self.stride,
      self.padding,
      fmt=self.fmt,
      impl=self.conv_impl,
      emulate_impl=self.emulate_impl,
      key=ops.noise_key(self.fmt, self.product_id),
      platform=self.platform,
    )


class Linear(nnx.Module):
  """Dense layer, kernel [in, out] (torch's [out, in], transposed); torch's default init."""

  def __init__(
    self,
    in_features,
    out_features,
    *,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    fmt='native',
    emulate_impl='auto',
    rngs,
  ):
    bound = 1.0 / math.sqrt(in_features)
    uniform = functools.partial(jax.random.uniform, dtype=param_dtype, minval=-bound, maxval=bound)
    self.kernel = nnx.Param(uniform(rngs.params(), (in_features, out_features)))
    self.bias = nnx.Param(uniform(rngs.params(), (out_features,)))
    self.dtype, self.fmt, self.emulate_impl = dtype, fmt, emulate_impl
    self.product_id, self.platform = 0, None  # name_products sets them

  def __call__(self, x):
    y = ops.dense(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      fmt=self.fmt,
      emulate_impl=self.emulate_impl,
      key=ops.noise_key(self.fmt, self.product_id),
      platform=self.platform,
    )
    return y + self.bias[...].astype(self.dtype)


class BatchNorm(nnx.Module):
  """torch.nn.BatchNorm2d semantics in f32 (momentum 0.1, eps 1e-5, unbiased running variance), over
  the global batch or per `group_size` examples (per-core BatchNorm on a TPU)."""

  momentum, epsilon = 0.1, 1e-5  # torch's defaults

  def __init__(self, num_features, *, group_size=0, dtype=jnp.float32, param_dtype=jnp.float32):
    self.scale = nnx.Param(jnp.ones((num_features,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((num_features,), param_dtype))
    self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32))
    self.var = nnx.BatchStat(jnp.ones((num_features,), jnp.float32))
    self.group_size, self.dtype = group_size, dtype
    self.use_running_average = False  # toggled by model.train() / model.eval()

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    if self.use_running_average:
      y = (x32 - self.mean[...]) * lax.rsqrt(self.var[...] + self.epsilon)
      return (y * self.scale[...] + self.bias[...]).astype(self.dtype)
    groups = x32.shape[0] // self.group_size if self.group_size else 1
    xg = x32.reshape((groups, -1) + x32.shape[1:])  # [G, B/G, H, W, C]
    axes = tuple(range(1, xg.ndim - 1))
    mean = jnp.mean(xg, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
    count = math.prod(xg.shape[1:-1])
    unbiased = var * (count / max(count - 1, 1))
    m = self.momentum
    assign(self.mean, (1 - m) * self.mean[...] + m * jnp.mean(mean, axis=(0,) + axes))
    assign(self.var, (1 - m) * self.var[...] + m * jnp.mean(unbiased, axis=(0,) + axes))
    y = (xg - mean) * lax.rsqrt(var + self.epsilon)
    return (y.reshape(x32.shape) * self.scale[...] + self.bias[...]).astype(self.dtype)


def assign(variable, value):
  """`variable[...] = value` without flax's sharding check on a traced value: a tracer's `sharding`
  builds JAX's error message, which scans the whole trace (0.5 s of a ResNet-50's 3.7 s tracing)."""
  if isinstance(value, jax.core.Tracer) and value.shape == variable.shape:
    variable.set_value(value.astype(variable.dtype))
  else:
    variable[...] = value


def product_id(path):
  """A layer's static noise id: the CRC-32 of its name ('layer2.0.downsample.0'), 31 bits."""
  return zlib.crc32('.'.join(map(str, path)).encode()) & 0x7FFFFFFF


def name_products(model, platform=None):
  """Give every Conv2d and Linear of `model` its product_id and `platform`; returns `model`."""
  for path, module in nnx.iter_modules(model):
    if isinstance(module, (Conv2d, Linear)):
      module.product_id, module.platform = product_id(path), platform
  return model


def count_params(model):
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _same(value):
  return value


BATCHNORM_KEYS = {'weight': 'scale', 'bias': 'bias', 'running_mean': 'mean', 'running_var': 'var'}


def torch_keys(model):
  """{torchvision state-dict key: (nnx Variable, torch value -> nnx value)} of `model`."""
  out = {}
  for path, module in nnx.iter_modules(model):
    prefix = '.'.join(map(str, path))
    if isinstance(module, Conv2d):
      out[f'{prefix}.weight'] = (module.kernel, lambda w: w.transpose(2, 3, 1, 0))
    elif isinstance(module, Linear):
      out[f'{prefix}.weight'] = (module.kernel, lambda w: w.T)
      out[f'{prefix}.bias'] = (module.bias, _same)
    elif isinstance(module, BatchNorm):
      for key, attr in BATCHNORM_KEYS.items():
        out[f'{prefix}.{key}'] = (getattr(module, attr), _same)
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool(x, window, strides, padding):
  return functools.reduce(lax.max, ops.window_slices(x, window, strides, padding, -jnp.inf))


def _max_pool_fwd(x, window, strides, padding):
  """(max over the window, (the offset XLA's select `>=` chooses, as uint8; x's shape))."""
  slices = ops.window_slices(x, window, strides, padding, -jnp.inf)
  out = chosen = slices[0]
  choice = jnp.zeros(out.shape, jnp.uint8)
  for offset, candidate in enumerate(slices[1:], start=1):
    out = lax.max(out, candidate)
    take = ~(chosen >= candidate)
    chosen = jnp.where(take, candidate, chosen)
    choice = jnp.where(take, jnp.uint8(offset), choice)
  return out, (choice, x.shape)


def _max_pool_bwd(window, strides, padding, residuals, cotangent):
  choice, (_, height, width, _) = residuals
  (top, _), (left, _) = padding
  out_h, out_w = cotangent.shape[1:3]
  zero = jnp.zeros((), cotangent.dtype)
  total = None
  offsets = [(i, j) for i in range(window[0]) for j in range(window[1])]
  # Descending offsets = ascending windows for each input element: XLA:CPU's order of additions.
  for offset in reversed(range(len(offsets))):
    i, j = offsets[offset]
    share = jnp.where(choice == offset, cotangent, zero)
    # Output (r, c) came from padded input (i + r*stride, j + c*stride); crop the padding.
    rows = (i - top, height + top - i - (out_h - 1) * strides[0] - 1, strides[0] - 1)
    cols = (j - left, width + left - j - (out_w - 1) * strides[1] - 1, strides[1] - 1)
    placed = lax.pad(share, zero, ((0, 0, 0), rows, cols, (0, 0, 0)))
    total = placed if total is None else total + placed
  return (total,)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(x, window, strides, padding):
  """flax's `nnx.max_pool` on NHWC `x`, bit for bit forward and gradient, from dense ops only (no
  scatter for XLA's deterministic GPU mode to serialise): docs/performance.md."""
  if x.ndim != 4:
    raise ValueError(f'max_pool: NHWC input expected, got shape {x.shape}')
  if window[0] * window[1] > 256:  # the chosen offset is kept as uint8
    raise ValueError(f'max_pool: windows of at most 256 elements, got {tuple(window)}')
  pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
  return _max_pool(x, tuple(map(int, window)), tuple(map(int, strides)), pairs)
