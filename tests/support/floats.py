"""float32 values for bit-exact checks of rounding: edge cases, random bit patterns, and equality
of bits (NaNs equal as NaNs)."""

import numpy as np

F32_EDGES = np.array(
  [
    0.0,
    -0.0,
    1.0,
    -1.0,
    1.00390625,
    1.0 + 2**-8 + 2**-9,
    1.0 + 3 * 2**-8,
    1.0 + 2**-11,
    1.0 + 3 * 2**-11,
    1.0 + 2**-11 + 2**-20,
    2**-149,
    -(2**-149),
    2**-140,
    3 * 2**-133,
    2**-126,
    2**-126 - 2**-149,
    np.finfo(np.float32).max,
    -np.finfo(np.float32).max,
    3.3895314e38,
    np.inf,
    -np.inf,
    np.nan,
    65504.0,
    1e-40,
    7.0e-39,
  ],
  np.float32,
)


def random_f32(n, seed=0):
  """n float32 values from uniformly random bit patterns (all exponents, subnormals, inf, nan)."""
  bits = np.random.default_rng(seed).integers(0, 2**32, size=n, dtype=np.uint64)
  return bits.astype(np.uint32).view(np.float32)


def same_bits(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  nan = np.isnan(b)
  return bool(
    np.all(np.isnan(a) == nan) and np.all(a.view(np.uint32)[~nan] == b.view(np.uint32)[~nan])
  )
