"""float32 values for bit-exact checks of rounding: edge cases, random bit patterns, and equality
of bits (NaNs equal as NaNs); the worst-case error of an f32 sum, for comparisons that are not
bit-exact because only the summation order differs."""

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


U32 = 2.0**-24  # float32's unit roundoff (round to nearest even)


def assert_within_summation_bound(got, ref, abs_sum, n, sides=1):
  """|got - ref| <= sides * (n - 1) * u * abs_sum, elementwise: each side an f32 sum of n products
  in any order, u = 2^-24. A recursive sum of n terms has |error| <= gamma_{n-1} sum |terms|
  (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4; gamma_k = k u /
  (1 - k u), here < 1.0001 k u, covered by the 1.01 below); a blocked or pairwise sum, as a
  vectorised dot makes, is within the same bound. `abs_sum`: sum |terms| per output (the product
  of the absolute operands); `sides`: 1 against an exact (float64) reference, 2 between two f32
  orders. The products themselves are exact here (rounded operands: bf16 x bf16 and tf32 x tf32
  products fit in f32's 24 bits) or each adds one more u |term|, covered by using n, not n - 1."""
  got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
  bound = 1.01 * sides * n * U32 * np.asarray(abs_sum, np.float64)
  excess = np.abs(got - ref) - bound
  assert np.all(excess <= 0), f'max |got - ref| - bound = {excess.max():.3g}'
