"""numerics/: bit-exact operand rounding, emulated product formats (forward and backward), the
precision flag in the lowered HLO, grouped BatchNorm, validation and the effective-format record."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from configs import common, validation
from experiments import numerics_probe
from models.layers import BatchNorm
from numerics import formats, ops, setup
from tests.support.floats import F32_EDGES, assert_within_summation_bound, random_f32, same_bits


def tf32_reference(x):
  """Round-to-nearest-even to 10 mantissa bits, in numpy integer arithmetic on the bit pattern."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
  q, r = bits >> 13, bits & 0x1FFF
  up = (r > 0x1000) | ((r == 0x1000) & (q & 1 == 1))
  out = ((q + up) << 13).astype(np.uint32).view(np.float32)
  return np.where(np.isnan(x), x, out)


@pytest.mark.parametrize('values', [F32_EDGES, random_f32(200_000)])
def test_round_bf16_equals_ml_dtypes(values):
  with np.errstate(invalid='ignore', over='ignore'):
    ref = values.astype(ml_dtypes.bfloat16).astype(np.float32)
  assert same_bits(formats.round_bf16(values), ref)


@pytest.mark.parametrize('values', [F32_EDGES, random_f32(200_000, seed=1)])
def test_round_tf32_bit_exact(values):
  assert same_bits(formats.round_tf32(values), tf32_reference(values))


def test_rounding_cases_by_hand():
  def r(f, v):
    return float(f(jnp.float32(v)))

  assert r(formats.round_bf16, 1.00390625) == 1.0  # a tie: to the even mantissa
  assert r(formats.round_bf16, 1.0 + 3 * 2**-8) == 1.0 + 2**-6  # a tie: up to the even one
  assert r(formats.round_bf16, np.finfo(np.float32).max) == np.inf  # overflow
  assert r(formats.round_tf32, 1.0 + 2**-11) == 1.0 and r(formats.round_tf32, 1.00390625) > 1
  assert r(formats.round_tf32, 2**-149) == 0.0  # smallest subnormal: a tie, to even (zero)
  assert np.isnan(r(formats.round_tf32, np.nan)) and r(formats.round_tf32, -np.inf) == -np.inf
  hi, lo = formats.split_bf16(jnp.float32(1.0 + 2**-8 + 2**-12))
  assert float(hi) == 1.0 + 2**-7 and float(lo) == -15 * 2**-12  # above the tie: up; lo exact


def test_reference_diagonal_example():
  """1.00390625 = 1 + 2^-8 needs 8 mantissa bits: bfloat16 keeps 7 (Google Cloud's "The bfloat16
  numerical format"), so it rounds (to even) to 1.0 and one bf16 pass gives 1.0; TF32 (10 bits)
  and f32 keep it, and its square 1 + 2^-7 + 2^-16 = 1.0078277587890625 is exact in f32."""
  a = jnp.eye(4, dtype=jnp.float32) * 1.00390625

  def diag(fmt):
    return float(ops.dense(a, a, fmt=fmt)[0, 0])

  assert diag('bf16') == 1.0
  assert diag('f32') == diag('tf32') == 1.0078277587890625
  assert diag('bf16_3x') == 1.0078125  # hi*hi + hi*lo + lo*hi; lo*lo = 2^-16 is not computed


def conv(a, b, fmt):
  return ops.conv2d(a, b, 2, [(1, 1), (1, 1)], fmt=fmt)


def operands(seed=0):
  k = jax.random.split(jax.random.key(seed), 6)
  return dict(
    x=jax.random.normal(k[0], (2, 6, 6, 5)),
    w=jax.random.normal(k[1], (3, 3, 5, 4)),
    dyc=jax.random.normal(k[2], (2, 3, 3, 4)),
    a=jax.random.normal(k[3], (7, 48)),
    b=jax.random.normal(k[4], (48, 6)),
    dyd=jax.random.normal(k[5], (7, 6)),
  )


@pytest.mark.parametrize('product', ['conv', 'dense'])
def test_emulate_f32_matches_native_on_cpu(product):
  o = operands()
  f = conv if product == 'conv' else (lambda a, b, m: ops.dense(a, b, fmt=m))
  x, w, dy = (o['x'], o['w'], o['dyc']) if product == 'conv' else (o['a'], o['b'], o['dyd'])

  @jax.jit
  def run(x, w, dy):
    out = {}
    for mode in ('native', 'f32', 'bf16'):
      y, vjp = jax.vjp(lambda a, b, m=mode: f(a, b, m), x, w)
      out[mode] = (y,) + vjp(dy)
    return out

  out = run(x, w, dy)
  # Bit-exact by construction (was rtol=atol=1e-6): 'f32' keeps the f32 operands as they are and
  # multiplies them with the same XLA product at HIGHEST, which XLA:CPU computes as its native f32
  # one; the gradients are JAX's transposes of that same product (numerics/ops.py: no custom
  # gradient).
  for g1, g0 in zip(out['f32'], out['native'], strict=True):
    np.testing.assert_array_equal(g1, g0)
  for g2, g0 in zip(
    out['bf16'], out['native'], strict=True
  ):  # the comparison can tell formats apart
    assert float(jnp.max(jnp.abs(g2 - g0))) > 1e-3


@pytest.mark.parametrize('mode', ['bf16', 'tf32'])
def test_emulated_dense_gradients_by_hand(mode):
  """dx = R(dy) @ R(k).T, dk = R(x).T @ R(dy), in float64 numpy: only f32 accumulation differs."""
  o = operands(1)
  r = formats.round_bf16 if mode == 'bf16' else formats.round_tf32
  x, k, dy = o['a'], o['b'], o['dyd']
  y, vjp = jax.vjp(lambda a, b: ops.dense(a, b, fmt=mode), x, k)
  dx, dk = vjp(dy)

  def f64(v):
    return np.asarray(v, np.float64)

  rx, rk, rdy = f64(r(x)), f64(r(k)), f64(r(dy))
  # Against float64 (exact products of rounded operands): only the f32 sums err, each within
  # (n - 1) u sum|terms| for its n terms: 48 for y, 6 for dx, 7 for dk (was atol=1e-5 everywhere,
  # below y's worst case of 1.2e-4 at these operands; measured here: <= 1.3e-6).
  ax, ak, ady = np.abs(rx), np.abs(rk), np.abs(rdy)
  assert_within_summation_bound(y, rx @ rk, ax @ ak, n=48)
  assert_within_summation_bound(dx, rdy @ rk.T, ady @ ak.T, n=6)
  assert_within_summation_bound(dk, rx.T @ rdy, ax.T @ ady, n=7)
  # Without rounding the cotangent the result would be measurably different.
  assert np.max(np.abs(f64(dx) - f64(dy) @ rk.T)) > 1e-3


@pytest.mark.parametrize('mode', ['bf16', 'tf32', 'bf16_3x'])
def test_emulated_conv_gradients_by_hand(mode):
  """Each backward product in the same format: the native vjp on the emulated parts."""
  o = operands(2)
  x, w, dy = o['x'], o['w'], o['dyc']
  _, vjp = jax.vjp(lambda a, b: conv(a, b, mode), x, w)
  dx, dw = vjp(dy)

  def hp(a, b):
    return ops._native_conv(a, b, 2, [(1, 1)] * 2, jax.lax.Precision.HIGHEST)

  if mode == 'bf16_3x':
    parts = formats.split_bf16

    def pairs(u, v):
      return [(u[0], v[1]), (u[1], v[0]), (u[0], v[0])]
  else:
    r = formats.round_bf16 if mode == 'bf16' else formats.round_tf32

    def parts(v):
      return (r(v),)

    def pairs(u, v):
      return [(u[0], v[0])]

  px, pw, pdy = parts(x), parts(w), parts(dy)
  hand_dx = sum(jax.vjp(lambda a, b=b: hp(a, b), x)[1](c)[0] for c, b in pairs(pdy, pw))
  hand_dw = sum(jax.vjp(lambda b, a=a: hp(a, b), w)[1](c)[0] for a, c in pairs(px, pdy))
  # Bit-exact by construction (was atol 2e-6): the same native transposed convolutions of the same
  # rounded parts, added in the same order of pairs as numerics/ops.py adds them.
  np.testing.assert_array_equal(dx, hand_dx)
  np.testing.assert_array_equal(dw, hand_dw)
  _, vjp0 = jax.vjp(lambda a, b: conv(a, b, 'f32'), x, w)
  full = 1e-4 if mode == 'bf16_3x' else 1e-3
  errs = [float(jnp.max(jnp.abs(g - g0))) for g, g0 in zip((dx, dw), vjp0(dy), strict=True)]
  assert all(e > full / 100 for e in errs) and all(e < full * 100 for e in errs)


def test_emulate_bf16_operands_keep_dtype():
  a = jnp.ones((3, 8), jnp.bfloat16)
  y = ops.dense(a, jnp.ones((8, 2), jnp.bfloat16), fmt='tf32')
  assert y.dtype == jnp.bfloat16 and float(y[0, 0]) == 8.0


def small_resnet_run(mode):
  """(logits, grads, [loss, loss after one SGD step]) of a tiny ResNet-18, one compile."""

  args = numerics_probe.parse_args(
    ['--model-width', '0.125', '--model-image', '8', '--model-batch', '8']
  )
  rng = np.random.default_rng(0)
  graphdef, params, rest = numerics_probe.model_parts(args, mode, rng=rng)
  x = rng.standard_normal((8, 8, 8, 3)).astype(np.float32)
  y = (np.arange(8) % 10).astype(np.int32)

  def loss(lg):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(lg), y[:, None], axis=1))

  def run(params, rest):
    logits, grads = numerics_probe.loss_and_grads(graphdef, params, rest, x, y)
    params = jax.tree.map(lambda p, d: p - 0.01 * d, params, grads)
    after = nnx.merge(graphdef, params, rest)(x)
    return logits, grads, jnp.stack([loss(logits), loss(after)])

  return jax.tree.map(np.asarray, jax.jit(run)(params, rest))


@pytest.fixture(scope='module')
def resnet_runs():
  """Native f32 and emulated one-pass bf16."""
  return {mode: small_resnet_run(mode) for mode in ('native', 'bf16')}


def test_resnet_emulate_bf16_changes_by_expected_magnitude(resnet_runs):
  """One-pass bf16 (eps 2^-8) moves logits by ~1e-3..1e-2, gradients more (ReLU/BN kinks on a
  tiny batch), and the training loss by ~1e-3."""
  ref, bf = resnet_runs['native'], resnet_runs['bf16']
  logits = np.linalg.norm(bf[0] - ref[0]) / np.linalg.norm(ref[0])

  def flat(t):
    return np.concatenate([g.ravel() for g in jax.tree.leaves(t)])

  grads = np.linalg.norm(flat(bf[1]) - flat(ref[1])) / np.linalg.norm(flat(ref[1]))
  losses = np.abs(bf[2] - ref[2]) / np.abs(ref[2])
  assert 3e-4 < logits < 1e-1, logits
  assert 3e-4 < grads < 1.0, grads
  assert np.all(losses < 3e-2) and np.min(losses) > 1e-5, losses


@pytest.fixture
def restore_precision():
  before = jax.config.jax_default_matmul_precision
  yield
  jax.config.update('jax_default_matmul_precision', before)


@pytest.mark.parametrize(
  'precision,expect',
  [
    ('highest', 'HIGHEST'),
    ('high', 'HIGH'),
    ('BF16_BF16_F32', 'lhs_precision_type = bf16'),
    ('F32_F32_F32', 'lhs_precision_type = f32'),
  ],
)
@pytest.mark.usefixtures('restore_precision')
def test_configured_precision_in_lowered_hlo(precision, expect):
  config = common.base_config()
  config.numerics.matmul_precision = precision
  setup.configure(config)
  a = jnp.ones((4, 8))
  text = jax.jit(lambda u, v: ops.dense(u, v)).lower(a, a.T).as_text()
  line = [s for s in text.splitlines() if 'dot_general' in s][0]
  assert expect in line, line
  if precision in ('high', 'highest'):
    ctext = (
      jax.jit(lambda u, v: ops.conv2d(u, v))
      .lower(jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 3)))
      .as_text()
    )
    assert f'precision {expect}>' in ctext or f'precision = [{expect}' in ctext


def test_grouped_batchnorm_equals_numpy():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 3, 2, 4)).astype(np.float32) * 3 + 1
  for k in (0, 2, 4):
    bn = BatchNorm(4, group_size=k)
    y = np.asarray(bn(jnp.asarray(x)))
    groups = x.reshape(8 // (k or 8), -1, 3, 2, 4).astype(np.float64)
    mean = groups.mean(axis=(1, 2, 3), keepdims=True)
    var = groups.var(axis=(1, 2, 3), keepdims=True)
    ref = ((groups - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    n = groups[0].size // 4
    # Against float64: the f32 mean of a group's n (<= 48) values errs by at most
    # d_mean = n u mean|x| (u = 2^-24; ~7e-6 here), the variance by a relative (n + 5) u; so y
    # within d_mean / sd + (n + 13) u |y| (as tests/integration/test_model.py derives it):
    # <= ~2.5e-6 + 3.6e-6 |y|, inside atol = rtol = 1e-5 (kept). The running mean (0.1 x the
    # groups' mean) within 0.1 d_mean absolute, which rtol 1e-5 alone does not give for a group
    # mean near 0 (atol added); the running variance within (n + 8) u = 3.3e-6 relative (kept).
    d_mean = n * 2.0**-24 * float(np.abs(groups).mean(axis=(1, 2, 3)).max())
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
      bn.mean[...], 0.1 * mean.mean(axis=0).ravel(), rtol=1e-5, atol=0.1 * d_mean
    )
    np.testing.assert_allclose(
      bn.var[...], 0.9 + 0.1 * (var * n / (n - 1)).mean(axis=0).ravel(), rtol=1e-5
    )
  assert not np.allclose(
    np.asarray(BatchNorm(4, group_size=2)(jnp.asarray(x))),
    np.asarray(BatchNorm(4)(jnp.asarray(x))),
    atol=1e-3,
  )


@pytest.mark.parametrize(
  'field,value',
  [
    ('matmul_precision', 'fast'),
    ('matmul_precision', 'bf16_bf16_f32'),
    ('compute_dtype', 'float16'),
    ('param_dtype', 'bf16'),
    ('conv_format', 'fp8'),
    ('conv_format', 'none'),
    ('profile', 'tpu'),
    ('batchnorm_group', -1),
    ('batchnorm_group', 2.5),
    ('gpu_deterministic', 'yes'),
  ],
)
def test_check_rejects_bad_values(field, value):
  # Not type-safe: values a YAML file or a careless override could still bring in.
  config = ml_collections.ConfigDict(common.base_config().to_dict(), type_safe=False)
  config.numerics[field] = value
  with pytest.raises(ValueError) as info:
    validation.check_numerics(config)
  message = str(info.value)
  assert f'config.numerics.{field}' in message and '\n' not in message


def test_check_accepts_every_documented_value():
  config = common.base_config()
  for p in formats.PRECISIONS:
    config.numerics.matmul_precision = p
    validation.check_numerics(config)
  for field, values in (
    ('profile', formats.PROFILES),
    ('conv_format', formats.names()),
    ('dense_format', formats.names()),
  ):
    for value in values:
      fresh = common.base_config()  # a profile and a format could contradict: one per config
      fresh.numerics[field] = value
      validation.check_numerics(fresh)


def test_kind_formats_make_platform_defaults_explicit():
  def f(platform, precision, fmt, dtype='float32'):
    return setup.effective_formats(platform, precision, {'conv': fmt, 'dense': fmt}, dtype)

  assert f('tpu', 'default', 'native') == {'conv': 'bf16', 'dense': 'bf16'}
  assert f('tpu', 'high', 'native')['dense'] == 'bf16_3x'
  assert f('gpu', None, 'native') == {'conv': 'tf32', 'dense': 'tf32'}
  assert f('gpu', 'bfloat16', 'native')['dense'] == 'tf32'  # 'bfloat16' on GPU is TF32
  assert f('gpu', 'highest', 'native')['dense'] == 'f32'
  assert f('gpu', 'BF16_BF16_F32', 'native') == {'conv': 'tf32', 'dense': 'bf16'}
  assert f('cpu', 'default', 'native') == {'conv': 'f32', 'dense': 'f32'}
  assert f('cpu', 'highest', 'bf16') == {'conv': 'bf16', 'dense': 'bf16'}
  assert f('tpu', 'highest', 'f32')['dense'] == 'bf16_6x'
  assert f('gpu', 'default', 'native', 'bfloat16')['dense'] == 'bf16'
  described = setup.describe(common.base_config())['effective']
  assert described['platform'] == 'cpu' and described['dense_format'] == 'f32'


def test_one_set_of_xla_flags_per_process(monkeypatch):
  """configure() puts a config's flags into XLA_FLAGS once per process; a later config asking for
  flags the first did not set is a one-line error (set once a backend runs, XLA would ignore
  them); run.build checks the flags are in place without changing anything."""
  monkeypatch.setattr(setup, '_applied', None)
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
  config = common.base_config()
  config.numerics.gpu_deterministic = True
  setup.configure(config)
  assert os.environ['XLA_FLAGS'].split() == [
    '--xla_force_host_platform_device_count=8',
    '--xla_gpu_deterministic_ops=true',
  ]
  setup.configure(config)  # the same flags again: nothing to do
  setup.require_configured(config)
  other = common.base_config()
  other.numerics.xla_flags = '--xla_cpu_use_thunk_runtime=false --xla_unheard_of_flag=1'
  with pytest.raises(ValueError, match='differ from the flags this process already applied'):
    setup.configure(other)
  with pytest.raises(ValueError, match='are not set in this process'):
    setup.require_configured(other)
  other.numerics.xla_flags = 'not_a_flag'
  with pytest.raises(ValueError, match='config.numerics.xla_flags must be space-separated'):
    validation.check_numerics(other)  # at resolution, before configure() is reached
  other.numerics.xla_flags = ''
  setup.configure(other)  # nothing missing: fine
  assert setup.xla_flags(other) == []
