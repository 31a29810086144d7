"""Emulated hardware product formats: the same arithmetic on TPU, GPU and CPU.

`emulated(product, x, kernel, fmt)` computes a bilinear `product` (a convolution or a matmul) the
way a hardware format would ('bf16', 'bf16_3x', 'tf32', 'f32', 'bf16_noise'; 'native' is not
emulated), forward and backward, by one of two implementations (`impl`: 'reference' at HIGHEST on
the rounded operands, 'fast' on the format's own units, 'auto'). What each format's passes are,
how the fast form keeps the very same operands, and what is tested: docs/numerics.md ("How
emulated products are computed").
"""

import collections
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core

from numerics import rounding, target
from numerics.formats import EMULATE_IMPLS, FAST_FORMATS, FORMATS, NOISY_FORMATS

# 'auto' on CPU, per format (benchmarks/bench_emulate.py; BENCHMARKS.md, "Emulated formats"):
# neither implementation measured faster there (XLA:CPU multiplies f32 either way: fast/reference
# 0.95-1.02, inside the run-to-run spread), so the reference, as before the fast path existed.
AUTO_ON_CPU = {'bf16': 'reference', 'bf16_3x': 'reference', 'tf32': 'reference'}
HIGHEST = lax.Precision.HIGHEST
DEFAULT = lax.Precision.DEFAULT

# How the fast path multiplies: operands of `dtype` at `precision`, f32 result; `split`: each
# operand's exact bf16 hi/lo parts (4 passes) instead of the operand itself.
FastPlan = collections.namedtuple('FastPlan', 'dtype precision split')
# Passes of a product of parts [p0, p1, ...] by [q0, q1, ...]: (i, j) = p_i * q_j, summed left to
# right. Two parts (bf16_3x): small terms first, then the large one, as XLA's X3 decomposition.
PASS_ORDER = {1: ((0, 0),), 2: ((0, 1), (1, 0), (0, 0))}
SPLIT_PASS_ORDER = ((1, 1), (0, 1), (1, 0), (0, 0))  # exact hi/lo parts: all four, small first


def resolve_impl(impl, platform=None, fmt=None):
  """What `impl` means for format `fmt` on `platform`: 'fast' or 'reference' ('native' for the
  platform's own format, fmt 'native').

  Without a format, only checks `impl` and returns it: validation calls it so, before JAX may start
  a backend (train.py resolves its config before jax.distributed.initialize). With a format, the
  platform defaults to the one being traced for (numerics/target.py: JAX's default backend unless a
  step is traced for other devices).
  """
  if impl not in EMULATE_IMPLS:
    raise ValueError(f'config.numerics.emulate_impl must be one of {EMULATE_IMPLS}, got {impl!r}')
  if fmt is None:
    return impl
  if fmt == 'native':
    return 'native'
  if fmt not in FAST_FORMATS:
    return 'reference'  # f32, bf16_noise: no faster exact form
  if impl != 'auto':
    return impl
  platform = platform or target.current()
  if platform != 'cpu':
    return 'fast'
  return AUTO_ON_CPU.get(fmt, 'reference')


def fast_plan(fmt, platform=None):
  """The FastPlan of `fmt` on `platform` (default: the one traced for, numerics/target.py): the
  passes docs/numerics.md describes."""
  if fmt not in FAST_FORMATS:
    raise ValueError(f'numerics: {fmt!r} has no fast form (one of {FAST_FORMATS})')
  platform = platform or target.current()
  if fmt == 'tf32' and platform == 'gpu':
    return FastPlan(jnp.float32, DEFAULT, False)  # TF32 tensor cores on exact TF32 operands
  if fmt == 'tf32' and platform != 'tpu':
    return FastPlan(jnp.float32, HIGHEST, False)  # no TF32 unit: the reference's product
  return FastPlan(jnp.bfloat16, DEFAULT, fmt == 'tf32')


def operand_parts(fmt, a, key=None):
  """The parts of operand `a` (f32) that `fmt` multiplies, as f32: [a'] or [hi, lo].

  The one rounding of every implementation: the fast path casts these very values (fast_operands).
  """
  if fmt == 'bf16_noise':
    return [rounding.dither_bf16(a, key)]
  if fmt == 'bf16':
    return [rounding.round_bf16(a)]
  if fmt == 'tf32':
    return [rounding.round_tf32(a)]
  if fmt == 'bf16_3x':
    return list(rounding.split_bf16(a))
  if fmt == 'f32':
    return [a]
  raise ValueError(f'numerics: no emulated format {fmt!r}; one of {FORMATS[1:]}')


def fast_operands(fmt, a, plan):
  """What the fast path multiplies for operand `a`: operand_parts(fmt, a), exactly split into
  bf16 hi/lo parts when `plan.split`, cast to `plan.dtype` (exact: they are values of it)."""
  parts = operand_parts(fmt, a)
  if plan.split:
    (part,) = parts
    parts = list(rounding.split_exact_bf16(part))
  return [p.astype(plan.dtype) for p in parts]


def _operand_keys(key):
  """Independent keys for the two operands of one product (None: no noise)."""
  if key is None:
    return None, None
  return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


def _sum_passes(multiply, pa, pb, order):
  """sum over (i, j) in `order`, left to right, of multiply(pa[i], pb[j])."""
  total = None
  for i, j in order:
    term = multiply(pa[i], pb[j])
    total = term if total is None else total + term
  return total


def emulated_bilinear(f, a, b, fmt, key=None, plan=None):
  """f(a, b, precision), bilinear in (a, b), in format `fmt`; f32 result. No custom gradient.

  `key`: the noise of a NOISY_FORMATS format (each operand draws from its own fold of it).
  `plan`: None for the reference implementation, else the FastPlan of the fast one.
  """
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  if plan is None:
    key_a, key_b = _operand_keys(key)
    pa, pb = operand_parts(fmt, a, key_a), operand_parts(fmt, b, key_b)
    return _sum_passes(lambda p, q: f(p, q, HIGHEST), pa, pb, PASS_ORDER[len(pa)])
  pa, pb = fast_operands(fmt, a, plan), fast_operands(fmt, b, plan)
  multiply = retyped(f, a.shape, b.shape, plan.precision)
  return _sum_passes(multiply, pa, pb, SPLIT_PASS_ORDER if plan.split else PASS_ORDER[len(pa)])


# Primitives that only move or copy values: exact in any dtype, so the fast path runs them in the
# operands' (narrow) dtype.
_MOVES = {
  'pad',
  'slice',
  'concatenate',
  'reshape',
  'transpose',
  'rev',
  'broadcast_in_dim',
  'squeeze',
  'expand_dims',
  'split',
  'copy',
  'copy_p',
}
_CONTRACTIONS = {'dot_general', 'conv_general_dilated'}


def retyped(f, a_shape, b_shape, precision):
  """(p, q) -> f(p, q) with every convolution and matmul of f taking p's and q's dtype at
  `precision` and giving an f32 result (the 'fast' form); p, q of a_shape and b_shape."""

  def at_highest(p, q):
    return f(p, q, HIGHEST)

  closed = jax.make_jaxpr(at_highest)(
    jax.ShapeDtypeStruct(a_shape, jnp.float32), jax.ShapeDtypeStruct(b_shape, jnp.float32)
  )

  def multiply(p, q):
    (out,) = _eval_retyped(closed.jaxpr, closed.consts, [p, q], precision)
    return out

  return multiply


def _contract(eqn, values, precision):
  """The convolution or matmul `eqn` on `values` (cast to their common dtype) at `precision`,
  f32 result. XLA:CPU has no bf16 x bf16 -> f32 kernels (its dot runtime rejects some such dots
  outright): there the operands are converted to f32 first, exactly, for the same products."""
  dtype = jnp.result_type(*values)  # both operands' dtype (f32 if they ever differed)
  params = dict(eqn.params, precision=(precision, precision), preferred_element_type=jnp.float32)

  def bind(*vs):
    return eqn.primitive.bind(*vs, **params)

  def upcast(*vs):
    return bind(*[v.astype(jnp.float32) for v in vs])

  values = [jnp.asarray(v, dtype) for v in values]
  if dtype == jnp.float32:
    return bind(*values)
  return lax.platform_dependent(*values, cpu=upcast, default=bind)


def _eval_retyped(jaxpr, consts, args, precision):
  """Evaluate `jaxpr` on `args` (see `retyped`): contractions re-typed, moves in their input's
  dtype, any other operation on its inputs converted (exactly) to the dtypes the jaxpr declares."""
  env = {}

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  for var, value in zip(
    list(jaxpr.constvars) + list(jaxpr.invars), list(consts) + list(args), strict=True
  ):
    env[var] = value
  for eqn in jaxpr.eqns:
    values = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if name in _CONTRACTIONS:
      outs = _contract(eqn, values, precision)
    elif name in _MOVES:
      dtype = jnp.result_type(values[0])
      outs = eqn.primitive.bind(*[jnp.asarray(v, dtype) for v in values], **eqn.params)
    elif name in ('jit', 'pjit'):
      inner = eqn.params['jaxpr']
      outs = _eval_retyped(inner.jaxpr, inner.consts, values, precision)
    else:
      if any(jex_core.jaxprs_in_params(eqn.params)):
        raise ValueError(f'numerics: the fast path cannot re-type a {name!r} in a product')
      values = [jnp.asarray(v, v_in.aval.dtype) for v, v_in in zip(values, eqn.invars, strict=True)]
      outs = eqn.primitive.bind(*values, **eqn.params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    for var, value in zip(eqn.outvars, outs, strict=True):
      env[var] = value
  return [read(v) for v in jaxpr.outvars]


def _transpose_x(product, x_shape):
  """(dy, k, precision) -> d/dx <dy, product(x, k)>: the transposed product in x."""
  x_spec = jax.ShapeDtypeStruct(x_shape, jnp.float32)

  def t(dy, k, precision):
    return jax.linear_transpose(lambda x: product(x, k, precision), x_spec)(dy)[0]

  return t


def _transpose_k(product, k_shape):
  """(x, dy, precision) -> d/dk <dy, product(x, k)>: the transposed product in k."""
  k_spec = jax.ShapeDtypeStruct(k_shape, jnp.float32)

  def t(x, dy, precision):
    return jax.linear_transpose(lambda k: product(x, k, precision), k_spec)(dy)[0]

  return t


def _pass_key(key, index):
  """The key of one of a product's three passes (0 forward, 1 input gradient, 2 kernel gradient)."""
  return None if key is None else jax.random.fold_in(key, index)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 5))
def _emulated(product, x, kernel, fmt, key, plan):
  return emulated_bilinear(product, x, kernel, fmt, _pass_key(key, 0), plan)


def _emulated_fwd(product, x, kernel, fmt, key, plan):
  return emulated_bilinear(product, x, kernel, fmt, _pass_key(key, 0), plan), (x, kernel, key)


def _emulated_bwd(product, fmt, plan, residuals, dy):
  x, kernel, key = residuals
  dy = dy.astype(jnp.float32)
  dx = emulated_bilinear(_transpose_x(product, x.shape), dy, kernel, fmt, _pass_key(key, 1), plan)
  dk = emulated_bilinear(_transpose_k(product, kernel.shape), x, dy, fmt, _pass_key(key, 2), plan)
  return dx.astype(x.dtype), dk.astype(kernel.dtype), None


_emulated.defvjp(_emulated_fwd, _emulated_bwd)


def emulated(product, x, kernel, fmt, *, key=None, impl='auto', platform=None):
  """product(x, kernel) computed, forward and backward, in format `fmt` (module doc).

  `product(a, b, precision)` must be bilinear in (a, b). The result has the dtype the native
  product would have (bf16 operands give a bf16 result, accumulated in f32 first). `key`: a PRNG
  key, required by (and only used by) NOISY_FORMATS. `impl`: see EMULATE_IMPLS; `platform`: whose
  'auto' choice and fast form to use (default: the one traced for, numerics/target.py).
  """
  if fmt not in FORMATS[1:]:
    raise ValueError(
      f"numerics: no emulated format {fmt!r}; one of {FORMATS[1:]} ('native' "
      'uses the platform product, without this module)'
    )
  if (fmt in NOISY_FORMATS) != (key is not None):
    raise ValueError(
      f'numerics: the {fmt!r} product '
      + ('needs a PRNG key' if key is None else 'takes no PRNG key')
    )
  fast = resolve_impl(impl, platform, fmt) == 'fast'
  plan = fast_plan(fmt, platform) if fast else None
  out_dtype = jnp.result_type(x, kernel)
  return _emulated(product, x, kernel, fmt, key, plan).astype(out_dtype)
