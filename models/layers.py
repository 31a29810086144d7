"""Conv2d, Linear and BatchNorm with torchvision's initialisation and parameter shapes.

Parameters are stored in f32 (`param_dtype`) and cast to the compute `dtype` at use; every product
goes through numerics/ops.py in the layer's format `fmt`, a noisy one keyed by the layer's static
`product_id`; BatchNorm statistics and normalisation are computed in float32. See docs/numerics.md.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

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
    self.dtype, self.fmt, self.emulate_impl = dtype, fmt, emulate_impl
    self.product_id = 0  # set by the model from the layer's name (models/resnet.py)
    ops.resolve_conv_impl(conv_impl)  # validates the name
    self.conv_impl = conv_impl  # 'auto' is resolved per shape at trace time (numerics/ops.py)

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
    self.kernel = nnx.Param(
      jax.random.uniform(rngs.params(), (in_features, out_features), param_dtype, -bound, bound)
    )
    self.bias = nnx.Param(
      jax.random.uniform(rngs.params(), (out_features,), param_dtype, -bound, bound)
    )
    self.dtype, self.fmt, self.emulate_impl = dtype, fmt, emulate_impl
    self.product_id = 0  # set by the model from the layer's name (models/resnet.py)

  def __call__(self, x):
    y = ops.dense(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      fmt=self.fmt,
      emulate_impl=self.emulate_impl,
      key=ops.noise_key(self.fmt, self.product_id),
    )
    return y + self.bias[...].astype(self.dtype)


class BatchNorm(nnx.Module):
  """torch.nn.BatchNorm2d semantics (momentum 0.1, eps 1e-5, unbiased running variance), in f32.

  group_size=0 normalises over the whole global batch (under jit with the batch sharded across
  devices the mean is already global). group_size=K normalises each consecutive group of K examples
  with its own statistics, as per-core BatchNorm does on a multi-core TPU; the running statistics
  then average the groups'.
  """

  def __init__(
    self,
    num_features,
    *,
    momentum=0.1,
    epsilon=1e-5,
    group_size=0,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
  ):
    self.scale = nnx.Param(jnp.ones((num_features,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((num_features,), param_dtype))
    self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32))
    self.var = nnx.BatchStat(jnp.ones((num_features,), jnp.float32))
    self.momentum, self.epsilon, self.group_size = momentum, epsilon, group_size
    self.dtype = dtype
    self.use_running_average = False  # toggled by model.train() / model.eval()

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    if self.use_running_average:
      mean, var = self.mean[...], self.var[...]
    else:
      groups = x32.shape[0] // self.group_size if self.group_size else 1
      xg = x32.reshape((groups, -1) + x32.shape[1:])  # [G, B/G, H, W, C]
      axes = tuple(range(1, xg.ndim - 1))
      mean = jnp.mean(xg, axis=axes, keepdims=True)
      var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
      count = math.prod(xg.shape[1:-1])
      unbiased = var * (count / max(count - 1, 1))
      m = self.momentum
      self.mean[...] = (1 - m) * self.mean[...] + m * jnp.mean(mean, axis=(0,) + axes)
      self.var[...] = (1 - m) * self.var[...] + m * jnp.mean(unbiased, axis=(0,) + axes)
      y = (xg - mean) * jax.lax.rsqrt(var + self.epsilon)
      y = y.reshape(x32.shape) * self.scale[...] + self.bias[...]
      return y.astype(self.dtype)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon) * self.scale[...] + self.bias[...]
    return y.astype(self.dtype)
