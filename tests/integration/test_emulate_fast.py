"""numerics/ops.py's fast path against its reference: the same products of the same operands.

- Every format's fast form (bf16; bf16_3x; tf32 as on a GPU and as on a TPU) equals the reference
  to f32 accumulation-order tolerance on every distinct ResNet-18 convolution and the dense head,
  forward and both gradients, for both convolution implementations.
- The operands the fast path multiplies are the reference's rounded operands, bit for bit; the
  TPU form's bf16 hi/lo split of TF32 values is exact, and so are its products.
- The lowered HLO: fast products take bf16 operands and give f32, backward ones included.
- A short training run follows the reference's loss curve.
"""

import json
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from benchmarks import bench_conv
from configs import common, validation
from experiments import numerics_probe
from numerics import formats, ops
from numerics import setup as numerics_setup
from tests.support.floats import F32_EDGES, random_f32, same_bits
from trainer import run, train

# The fast forms: (format, platform whose form is used). bf16 and bf16_3x have one form everywhere;
# tf32 has the GPU's (TF32 tensor cores; also CPU's) and the TPU's (4 exact bf16 passes).
FORMS = [('bf16', 'gpu'), ('bf16_3x', 'gpu'), ('tf32', 'gpu'), ('tf32', 'tpu')]
CONVS = bench_conv.resnet18_convs(224)  # the 11 distinct convolutions of ResNet-18
# f32 accumulation-order tolerance: max |fast - reference| <= TOL * max |reference|, per output.
# (Rounding the operands to another format moves outputs by >= 1e-3 relative: see the control.)
# Where it comes from: both sides multiply the same rounded operands exactly (bf16 and tf32
# products fit in f32) and differ only in how the f32 sums are ordered and split (the TPU form sums
# 3 bf16 passes). The worst case, 2 (n - 1) u sum|terms| (u = 2^-24, n up to 3*3*512 = 4608),
# reaches ~1e-3 of max |y| and would not tell formats apart; the rounding errors of a sum are
# independent in sign and grow as sqrt(n) u (Higham, Accuracy and Stability, 2nd ed., sec. 2.8 and
# 4.2): ~sqrt(4608) * 2^-24 * 2 sides = 8e-6 of the sum of magnitudes, of the order of max |y|
# for these random operands. TOL is 2.5 x that; kept, not derived to a guarantee.
TOL = 2e-5


def conv_case(conv, rng, batch=2, out_size=4):
  """(product, x, kernel, dy) of one ResNet-18 convolution on a small map (output out_size^2)."""
  size = out_size * conv.stride
  x = rng.standard_normal((batch, size, size, conv.cin)).astype(np.float32)
  w = rng.standard_normal((conv.k, conv.k, conv.cin, conv.cout)).astype(np.float32)
  out = bench_conv.conv_out(size, conv.k, conv.stride, conv.pad)
  dy = rng.standard_normal((batch, out, out, conv.cout)).astype(np.float32)
  return (conv.stride, conv.pad), x, w, dy


def cases(rng):
  """[(name, x, w, dy)] for every ResNet-18 conv and the fc head (512 -> 1000)."""
  out = [(c.names[0], *conv_case(c, rng)) for c in CONVS]
  x = rng.standard_normal((4, 512)).astype(np.float32)
  w = rng.standard_normal((512, 1000)).astype(np.float32)
  return out + [('fc', None, x, w, rng.standard_normal((4, 1000)).astype(np.float32))]


def product_of(geometry, conv_impl):
  if geometry is None:
    return ops._native_dense
  stride, pad = geometry
  conv = ops.CONV_PRODUCTS[conv_impl]
  return lambda a, b, precision: conv(a, b, stride, [(pad, pad)] * 2, precision)


def forward_and_grads(product, mode, impl, platform, x, w, dy):
  """(y, dx, dw) of the emulated product under `impl`."""

  def f(a, b):
    return ops.emulated(product, a, b, mode, impl=impl, platform=platform)

  y, vjp = jax.vjp(f, x, w)
  return (y,) + vjp(dy)


def run_all(mode, platform, conv_impl, impls):
  """{impl: [(y, dx, dw) per case]}, every case and impl in one compiled program."""
  all_cases = cases(np.random.default_rng(0))
  args = [(x, w, dy) for _, _, x, w, dy in all_cases]

  def run(args):
    return {
      impl: [
        forward_and_grads(product_of(g, conv_impl), mode, impl, platform, *a)
        for (_, g, *_), a in zip(all_cases, args, strict=True)
      ]
      for impl in impls
    }

  # Compiled without backend optimisations (seconds instead of a minute on a small CPU; both
  # implementations alike).
  compiled = jax.jit(run).lower(args).compile({'xla_backend_optimization_level': 0})
  return [c[0] for c in all_cases], jax.device_get(compiled(args))


def worst_relative(a_outs, b_outs):
  """max over cases and outputs of max |a - b| / max |b|, and where."""
  worst = (0.0, (0, 'y'))
  for i, (a3, b3) in enumerate(zip(a_outs, b_outs, strict=True)):
    for name, a, b in zip(('y', 'dx', 'dw'), a3, b3, strict=True):
      err = float(np.max(np.abs(np.float64(a) - b)) / np.max(np.abs(b)))
      worst = max(worst, (err, (i, name)))
  return worst


# Every form with XLA's convolution (what GPUs and TPUs run); im2col's (CPU) pads, slices and
# concatenations run in bf16 in the fast path: checked with one and with split operands.
@pytest.mark.parametrize(
  'mode,platform,conv_impl',
  [form + ('xla',) for form in FORMS] + [('bf16', 'gpu', 'im2col'), ('tf32', 'tpu', 'im2col')],
)
def test_fast_equals_reference_on_every_resnet18_product(mode, platform, conv_impl):
  names, out = run_all(mode, platform, conv_impl, ('reference', 'fast'))
  err, where = worst_relative(out['fast'], out['reference'])
  assert err <= TOL, (err, names[where[0]], where[1])


def test_the_tolerance_tells_formats_apart():
  """The control: the reference in bf16 against the reference in f32 misses TOL by far."""
  _, bf16 = run_all('bf16', 'cpu', 'xla', ('reference',))
  _, f32 = run_all('f32', 'cpu', 'xla', ('reference',))
  err, _ = worst_relative(bf16['reference'], f32['reference'])
  assert err > 50 * TOL


def as_f32(a):
  """A bf16 or f32 array's values as float32, converted by numpy (ml_dtypes), not by XLA."""
  a = np.asarray(a)
  return a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a


@pytest.mark.parametrize('mode,platform', FORMS)
@pytest.mark.parametrize('values', [F32_EDGES, random_f32(100_000, seed=3)])
def test_fast_operands_are_the_reference_operands_bit_for_bit(mode, platform, values):
  plan = ops.fast_plan(mode, platform)
  fast = [as_f32(p) for p in ops.fast_operands(mode, values, plan)]
  reference = [np.asarray(p) for p in ops.operand_parts(mode, values)]
  assert all(p.dtype == np.dtype(plan.dtype) for p in ops.fast_operands(mode, values, plan))
  if not plan.split:
    assert len(fast) == len(reference)
    assert all(same_bits(f, r) for f, r in zip(fast, reference, strict=True))
    return
  (t,) = reference  # TPU tf32: exact bf16 hi/lo parts of the TF32 operand
  with np.errstate(invalid='ignore'):
    total = np.where(np.isfinite(t), fast[0] + fast[1], fast[0])
  exact = ~np.isfinite(t) | (np.abs(t) >= 2.0**-116)
  assert same_bits(total[exact], t[exact]) and np.all(total[t == 0] == 0)  # -0 + 0 is +0
  tiny = np.isfinite(t) & ~exact  # lo subnormal: flushed or rounded, hi's 8 bits remain
  bound = np.maximum(2.0**-7 * np.abs(t[tiny]), 2.0**-133)  # (and hi's subnormal grid)
  assert np.all(np.abs(np.float64(total[tiny]) - t[tiny]) <= bound)


def test_split_parts_are_bf16_values_and_hi_never_overflows():
  t = formats.round_tf32(random_f32(100_000, seed=4))
  t = np.asarray(t)[np.isfinite(t) & (np.abs(t) >= 2.0**-116)]
  t = np.concatenate([t, [np.float32(2**128 - 2**117), -np.float32(2**128 - 2**117)]])  # TF32 max
  hi, lo = (np.asarray(p) for p in formats.split_exact_bf16(t))
  for part in (hi, lo):
    assert same_bits(part.astype(ml_dtypes.bfloat16).astype(np.float32), part)
  assert np.all(np.isfinite(hi)) and same_bits(hi + lo, t)


def test_tpu_tf32_form_gives_exact_products():
  """K = 1: the 4 bf16 passes of TF32 operands sum to the exact product (22 significant bits)."""
  rng = np.random.default_rng(5)

  def scale(n):
    return np.exp2(rng.integers(-30, 30, n)).astype(np.float32)

  x = (rng.standard_normal((64, 1)) * scale((64, 1))).astype(np.float32)
  k = (rng.standard_normal((1, 48)) * scale((1, 48))).astype(np.float32)
  exact = np.float64(formats.round_tf32(x)) @ np.float64(formats.round_tf32(k))
  for plan in (ops.fast_plan('tf32', 'tpu'), None):  # fast TPU form; the reference
    y = ops.emulated_bilinear(ops._native_dense, x, k, 'tf32', plan=plan)
    assert same_bits(y, exact.astype(np.float32)) and np.all(np.float64(y) == exact)


# A convolution or dot in StableHLO text: its precision (printed unless DEFAULT, in one of two
# spellings) and its operand and result element types.
CONTRACTION = re.compile(
  r'stablehlo\.(convolution|dot_general)(?:.*precision(?:_config)? = \['
  r'(?:#stablehlo<precision )?(\w+))?.*: \(tensor<[^>]*x(\w+)>, '
  r'tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>'
)


def contractions(mode, impl, product, x, w, lowering_platform):
  """[(op, precision, lhs dtype, rhs dtype, result dtype)] of the lowered forward + backward."""

  def f(a, b):
    return ops.emulated(product, a, b, mode, impl=impl, platform=lowering_platform)

  grads = jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b) ** 2), argnums=(0, 1)))
  platform = {'gpu': 'cuda'}.get(lowering_platform, lowering_platform)
  text = jax.export.export(grads, platforms=[platform])(x, w).mlir_module()
  return [
    (op, precision or 'DEFAULT', *types)
    for op, precision, *types in (m.groups() for m in CONTRACTION.finditer(text))
  ]


@pytest.mark.parametrize('lowering_platform', ['gpu', 'tpu'])
@pytest.mark.parametrize('kind', ['conv', 'dense'])
def test_lowered_fast_products_take_bf16_and_give_f32(kind, lowering_platform):
  """Forward and both backward products, as a GPU / TPU compiler receives them."""
  x, w = (np.ones((2, 8, 8, 4), np.float32), np.ones((3, 3, 4, 6), np.float32))
  product = product_of((2, 1), 'xla')
  if kind == 'dense':
    x, w, product = np.ones((4, 16), np.float32), np.ones((16, 8), np.float32), product_of(None, 0)
  op = 'convolution' if kind == 'conv' else 'dot_general'
  expected = {  # (mode, impl) -> (passes, precision, operand dtype)
    ('bf16', 'fast'): (1, 'DEFAULT', 'bf16'),
    ('bf16_3x', 'fast'): (3, 'DEFAULT', 'bf16'),
    ('tf32', 'fast'): (
      (4, 'DEFAULT', 'bf16') if lowering_platform == 'tpu' else (1, 'DEFAULT', 'f32')
    ),
    ('bf16', 'reference'): (1, 'HIGHEST', 'f32'),
  }
  for (mode, impl), (passes, precision, dtype) in expected.items():
    found = contractions(mode, impl, product, x, w, lowering_platform)
    assert found == [(op, precision, dtype, dtype, 'f32')] * (3 * passes), (mode, impl, found)


def test_resolve_impl():
  assert ops.resolve_impl('auto', 'gpu', 'bf16') == 'fast'
  assert ops.resolve_impl('auto', 'tpu', 'tf32') == 'fast'
  fast_formats = [f for f, entry in formats.FORMATS.items() if entry.fast]
  assert fast_formats == ['bf16', 'bf16_3x', 'tf32']
  for mode in fast_formats:
    assert ops.resolve_impl('auto', 'cpu', mode) == 'reference'  # as measured on CPU
    assert ops.resolve_impl('reference', 'gpu', mode) == 'reference'
    assert ops.resolve_impl('fast', 'cpu', mode) == 'fast'
  for mode in ('f32', 'bf16_noise'):  # no faster exact form
    assert ops.resolve_impl('fast', 'gpu', mode) == 'reference'
  assert ops.resolve_impl('fast', 'gpu', 'native') == 'native'
  assert ops.resolve_impl('auto') == 'auto'  # validation only: no backend asked for
  assert ops.fast_plan('tf32', 'cpu') == formats.FastPlan('float32', 'HIGHEST', False)  # no TF32
  assert ops.fast_plan('tf32', 'gpu') == formats.FastPlan('float32', 'DEFAULT', False)
  with pytest.raises(ValueError, match='emulate_impl must be one of'):
    ops.resolve_impl('quick')


def test_fast_without_a_fast_form_is_the_reference():
  x, w = np.float32(np.random.default_rng(6).standard_normal((2, 8, 8)))
  key = jax.random.key(0)
  for mode, k in (('f32', None), ('bf16_noise', key)):
    ys = [ops.emulated(ops._native_dense, x, w, mode, key=k, impl=i) for i in ('fast', 'reference')]
    assert same_bits(*ys)


def loss_curve(impl, steps=6):
  """Per-step training losses of the digits smoke run in the bf16 format and `impl`."""
  config = validation.resolve(
    common.load(
      'configs/digits.py:smoke',
      [('numerics.profile', 'tpu_default'), ('numerics.emulate_impl', impl)],
    )
  )
  numerics_setup.configure(config)
  ctx = run.build(config)  # data parallel over the 8 (virtual) devices, as the trainer runs
  model, _ = run.init_model(ctx)
  state, step_fn = train.enter_phase(ctx, train.initial_state(ctx, model), ctx.phases[0], 0)
  sums = []
  for batch in run.batches(ctx, 0, steps):
    state = step_fn(state, batch)
    sums.append(float(jax.device_get(state['sums']['loss'])))
  resolved = numerics_setup.describe(config)['effective']['emulate_impl']
  return resolved, np.diff([0.0] + sums), jax.device_get(state['params'])


def test_training_loss_curve_fast_equals_reference():
  """Over the 8 (virtual) devices, as the trainer runs: the curve and the weights bit for bit."""
  before = jax.config.jax_default_matmul_precision
  try:
    fast_impl, fast, fast_params = loss_curve('fast')
    ref_impl, ref, ref_params = loss_curve('reference')
  finally:
    jax.config.update('jax_default_matmul_precision', before)
  assert fast_impl == {'conv': 'fast', 'dense': 'fast'}  # per product kind
  assert ref_impl == {'conv': 'reference', 'dense': 'reference'}
  # Bit-exact by construction on XLA:CPU (was rtol 1e-5, params rtol 1e-4 + atol 1e-6): it has no
  # bf16 x bf16 -> f32 product, so the fast form converts its bf16 operands to f32, exactly, and
  # multiplies the reference's rounded operands with the same f32 product (numerics/ops.py).
  np.testing.assert_array_equal(fast, ref)
  for a, b in zip(jax.tree.leaves(fast_params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_numerics_probe_compares_fast_with_reference_and_native(tmp_path, capsys):
  """`python -m experiments.numerics_probe`: the fast path's rows and pairs (on a GPU: against the
  native hardware; here on CPU, where every format's native product is f32, against the
  reference)."""
  numerics_probe.main(
    [
      '--out',
      str(tmp_path),
      '--settings',
      'default,emu:tf32,fast:tf32',
      '--model-settings',
      '',
      '--rows',
      '8',
      '--cols',
      '8',
      '--classes',
      '10',
      '--conv-spatial',
      '2',
      '--conv-batch',
      '1',
    ]
  )
  capsys.readouterr()
  result = json.loads((tmp_path / 'numerics.json').read_text())
  pairs = {r['pair']: r for r in result['pairs']}
  assert set(pairs) == {'emu:tf32 vs default', 'fast:tf32 vs default', 'fast:tf32 vs emu:tf32'}
  fast_vs_ref = pairs['fast:tf32 vs emu:tf32']
  assert fast_vs_ref['matmuls'] <= TOL and fast_vs_ref['layers'] <= TOL
  assert pairs['fast:tf32 vs default']['layers'] > 1e-4  # CPU's native product is f32, not TF32
  assert all(r['fast:tf32'] is not None for r in result['layers'])
