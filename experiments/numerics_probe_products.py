"""The products experiments/numerics_probe.py measures: the cases (matmuls, ResNet-18's distinct
convolutions, its fc layer), their operands (Kaiming-scaled weights, post-ReLU-like activations),
their float64 references, and dense and conv in the form run_setting calls them,
fn(x, w, fmt, impl).
"""

import functools

import numpy as np

from numerics import ops


def conv_ref(x, k, stride, pad):
  """NHWC x HWIO convolution in float64 numpy (im2col)."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kh = k.shape[0]
  win = np.lib.stride_tricks.sliding_window_view(x, (kh, kh), axis=(1, 2))[:, ::stride, ::stride]
  return np.einsum('nhwcij,ijco->nhwo', win, np.asarray(k, np.float64), optimize=True)


def activations(rng, shape):
  """Post-ReLU-like inputs (non-negative, half zeros), float32."""
  return np.maximum(rng.standard_normal(shape), 0).astype(np.float32)


def kaiming(rng, shape, fan):
  return (rng.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32)


def dense(a, b, fmt, impl):
  return ops.dense(a, b, fmt=fmt, emulate_impl=impl)


def conv(a, b, fmt, impl, stride, pad):
  return ops.conv2d(a, b, stride, [(pad, pad)] * 2, fmt=fmt, emulate_impl=impl)


# ResNet-18's distinct convolutions: (name, kernel, in, out, stride).
CONVS = (
  ('conv1', 7, 3, 64, 2),
  ('layer1', 3, 64, 64, 1),
  ('layer2.0.conv1', 3, 64, 128, 2),
  ('layer2', 3, 128, 128, 1),
  ('layer2.ds', 1, 64, 128, 2),
  ('layer3.0.conv1', 3, 128, 256, 2),
  ('layer3', 3, 256, 256, 1),
  ('layer3.ds', 1, 128, 256, 2),
  ('layer4.0.conv1', 3, 256, 512, 2),
  ('layer4', 3, 512, 512, 1),
  ('layer4.ds', 1, 256, 512, 2),
)


def product_cases(args, rng, matmul_k):
  """[(kind, name, K, fn(x, w, fmt, impl), x, w, float64 reference)] for every product: a matmul
  per reduction length of `matmul_k`, then each layer of CONVS and the fc layer."""
  cases = []
  for k in matmul_k:
    x, w = rng.standard_normal((args.rows, k)).astype(np.float32), kaiming(rng, (k, args.cols), k)
    cases.append(('matmul', f'K={k}', k, dense, x, w, x.astype(np.float64) @ w.astype(np.float64)))
  for name, kk, cin, cout, stride in CONVS:
    size = args.conv_spatial * stride  # input size; the output is conv_spatial, K does not care
    shape = (args.conv_batch, size, size, cin)
    x = (
      rng.standard_normal(shape).astype(np.float32) if name == 'conv1' else activations(rng, shape)
    )
    w, pad = kaiming(rng, (kk, kk, cin, cout), kk * kk * cout), kk // 2
    fn = functools.partial(conv, stride=stride, pad=pad)
    cases.append(('layer', name, kk * kk * cin, fn, x, w, conv_ref(x, w, stride, pad)))
  x, w = activations(rng, (args.rows, 512)), kaiming(rng, (512, args.classes), 512)
  cases.append(('layer', 'fc', 512, dense, x, w, x.astype(np.float64) @ w.astype(np.float64)))
  return cases
