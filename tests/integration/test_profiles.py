"""numerics/formats.py: per-kind product formats and named profiles (expansion, contradictions,
the formats in describe() and in the arithmetic of a conv and a dense layer), and the noise control
(unbiased, bf16-sized, keyed by seed and step in the train and eval steps)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from configs import common, validation
from models import layers, resnet
from numerics import formats, ops, setup
from trainer import run, train

SMOKE = 'configs/digits.py:smoke'
A, B = 1 + 2**-9, 1 + 2**-12  # A: TF32-exact, not bf16; B: neither TF32 nor bf16
BF16_SUM, TF32_SUM, F32_SUM = 2.0, 2 + 2**-9, 2 + 2**-9 + 2**-12  # A*1 + B*1 in each format
# (conv, dense) of each profile on CPU: what describe() records and what the layers compute.
CPU_FORMATS = {
  'native': ('f32', 'f32'),
  'tpu_default': ('bf16', 'bf16'),
  'jax_gpu_default': ('tf32', 'tf32'),
  'torch_gpu_default': ('tf32', 'f32'),
  'f32': ('f32', 'f32'),
  'bf16_noise': ('bf16_noise', 'bf16_noise'),
}
SUMS = {'bf16': BF16_SUM, 'tf32': TF32_SUM, 'f32': F32_SUM}


def test_every_profile_is_documented_and_listed():
  assert set(CPU_FORMATS) == set(formats.PROFILES)
  for name, profile in formats.PROFILES.items():
    assert len(profile.description) > 100, name
  torch_doc = formats.PROFILES['torch_gpu_default'].description
  assert 'PyTorch' in torch_doc and 'TF32' in torch_doc and '1.12' in torch_doc
  assert 'jax.default_matmul_precision' in formats.PROFILES['tpu_default'].description


def resolved(arg='', overrides=()):
  return validation.resolve(common.load(f'{SMOKE},{arg}' if arg else SMOKE, overrides))


@pytest.mark.parametrize('profile', list(CPU_FORMATS))
def test_profile_expands_idempotently_and_is_recorded(profile):
  loaded = common.load(f'{SMOKE},numerics.profile={profile}')
  config = validation.resolve(loaded)
  saved = config.to_dict()['numerics']  # runrecord/record.py stores config.to_dict()
  conv, dense = formats.PROFILES[profile].conv, formats.PROFILES[profile].dense
  assert (saved['profile'], saved['conv_format'], saved['dense_format']) == (profile, conv, dense)
  again = formats.expand(formats.expand(loaded.copy_and_resolve_references()))
  assert again.to_dict() == config.to_dict()
  assert loaded.numerics.conv_format == ''  # resolution copies: the loaded config is as written


def test_explicit_formats_and_the_profile():
  config = resolved()
  assert (config.numerics.conv_format, config.numerics.dense_format) == ('native', 'native')
  config = resolved('numerics.conv_format=bf16,numerics.dense_format=bf16')
  assert (config.numerics.conv_format, config.numerics.dense_format) == ('bf16', 'bf16')
  config = resolved(overrides=[('numerics.conv_format', 'tf32')])
  assert (config.numerics.conv_format, config.numerics.dense_format) == ('tf32', 'native')
  same = resolved('numerics.profile=tpu_default', [('numerics.dense_format', 'bf16')])
  assert (same.numerics.conv_format, same.numerics.dense_format) == ('bf16', 'bf16')


@pytest.mark.parametrize(
  'arg, overrides, fields',
  [
    (
      'numerics.profile=tpu_default',
      [('numerics.conv_format', 'f32')],
      ('config.numerics.conv_format', 'config.numerics.profile'),
    ),
    (
      'numerics.profile=torch_gpu_default',
      [('numerics.dense_format', 'tf32')],
      ('config.numerics.dense_format', 'config.numerics.profile'),
    ),
    ('', [('numerics.profile', 'tpu')], ('config.numerics.profile',)),
    ('', [('numerics.conv_format', 'fp8')], ('config.numerics.conv_format',)),
    ('', [('numerics.conv_format', 'none')], ('config.numerics.conv_format',)),
  ],
)
def test_contradictory_or_unknown_settings_are_one_line_errors(arg, overrides, fields):
  with pytest.raises(ValueError) as info:
    resolved(arg, overrides)
  message = str(info.value)
  assert '\n' not in message and all(f in message for f in fields), message


@pytest.mark.parametrize(
  'arg, overrides', [('numerics.emulate=bf16', []), ('', [('numerics.emulate', 'none')])]
)
def test_the_removed_emulate_field_says_how_to_convert(arg, overrides):
  """Configs written with `emulate` get one line naming the fields that replace it."""
  with pytest.raises(ValueError) as info:
    resolved(arg, overrides)
  message = str(info.value)
  assert '\n' not in message and 'numerics.emulate' in message
  assert 'numerics.conv_format=F and numerics.dense_format=F for emulate=F' in message


def test_overrides_before_resolution_replace_the_profile():
  """experiments/divergence applies arm overrides to a loaded config, then resolves it: a new
  profile is simply the profile (nothing was expanded yet)."""
  config = common.load(f'{SMOKE},numerics.profile=torch_gpu_default')
  common.apply_overrides(config, [('numerics.profile', 'f32')])
  config = validation.resolve(config)
  assert (config.numerics.conv_format, config.numerics.dense_format) == ('f32', 'f32')


def test_a_resolved_config_is_final():
  """A second resolution and an in-place change both fail loudly; the trainer refuses a config
  that was never resolved."""
  config = resolved('numerics.profile=tpu_default')
  with pytest.raises(TypeError, match='already resolved'):
    validation.resolve(config)
  with pytest.raises(AttributeError, match='immutable'):
    config.numerics.profile = 'f32'
  with pytest.raises(AttributeError, match='immutable'):
    config.numerics['conv_format'] = 'f32'
  with pytest.raises(TypeError, match='needs a resolved config'):
    run.build(common.load(SMOKE))


@pytest.mark.parametrize('profile', list(CPU_FORMATS))
def test_describe_records_each_kinds_format(profile):
  config = resolved(f'numerics.profile={profile}')
  described = setup.describe(config)
  effective = described['effective']
  assert (effective['conv_format'], effective['dense_format']) == CPU_FORMATS[profile]
  assert described['requested']['profile'] == profile
  wanted = {kind: getattr(formats.PROFILES[profile], kind) for kind in formats.KINDS}
  emulated = {kind: fmt != 'native' for kind, fmt in wanted.items()}
  assert effective['emulated'] == emulated
  assert effective['emulate_impl'] == {
    k: 'reference' if v else 'native' for k, v in emulated.items()
  }


def test_kind_formats_per_platform_precision_impl_and_dtype():
  def f(platform, precision, profile, dtype='float32', dot=False):
    wanted = {kind: getattr(formats.PROFILES[profile], kind) for kind in formats.KINDS}
    return tuple(setup.effective_formats(platform, precision, wanted, dtype, dot).values())

  assert f('tpu', 'default', 'native') == ('bf16', 'bf16')
  assert f('gpu', 'default', 'native') == ('tf32', 'tf32')
  assert f('gpu', 'highest', 'native') == ('f32', 'f32')
  assert f('gpu', 'BF16_BF16_F32', 'native') == ('tf32', 'bf16')  # native convs ignore presets
  assert f('gpu', 'BF16_BF16_F32', 'native', dot=True) == ('bf16', 'bf16')  # im2col: a dot
  assert f('gpu', 'BF16_BF16_F32', 'torch_gpu_default', dot=True) == ('tf32', 'f32')  # emulated
  assert f('tpu', 'default', 'torch_gpu_default') == ('tf32', 'bf16_6x')  # f32 = 6 passes on TPU
  assert f('gpu', 'default', 'torch_gpu_default', 'bfloat16') == ('bf16', 'bf16')
  assert f('cpu', 'default', 'bf16_noise', 'bfloat16') == ('bf16_noise', 'bf16_noise')


def layer_outputs(profile):
  """(conv, dense) outputs of the model's first convolution and its head on A and B."""
  config = resolved(f'numerics.profile={profile}')
  model = models.build(config, 2, 2, nnx.Rngs(0))
  kernel = np.zeros(model.conv1.kernel.shape, np.float32)
  kernel[1, 1, :, 0] = 1.0  # the centre tap of both input channels into output channel 0
  model.conv1.kernel[...] = jnp.asarray(kernel)
  dense = np.zeros(model.fc.kernel.shape, np.float32)
  dense[:2, 0] = 1.0
  model.fc.kernel[...], model.fc.bias[...] = jnp.asarray(dense), jnp.zeros(2)
  image = np.broadcast_to(np.array([A, B], np.float32), (1, 3, 3, 2))
  features = np.zeros((1, dense.shape[0]), np.float32)
  features[0, :2] = A, B
  with ops.noise_scope(jax.random.key(0)):
    return float(model.conv1(jnp.asarray(image))[0, 1, 1, 0]), float(model.fc(features)[0, 0])


@pytest.mark.parametrize('profile', list(CPU_FORMATS))
def test_each_profile_computes_the_formats_it_claims(profile):
  """A*1 + B*1 is 2 in bf16, 2 + 2^-9 in TF32 and exact in f32: every conv and dense layer of
  the model computes it in its profile's format (on CPU the native product is f32)."""
  conv, dense = layer_outputs(profile)
  if profile == 'bf16_noise':  # within the noise's reach of the exact sum, and none of the others
    for value in (conv, dense):
      assert abs(value - F32_SUM) < 2**-6 and value not in SUMS.values()
    return
  assert (conv, dense) == tuple(SUMS[fmt] for fmt in CPU_FORMATS[profile])


def test_noise_control_is_unbiased_with_the_size_of_bf16_rounding():
  rng = np.random.default_rng(0)
  a = rng.standard_normal((32, 256)).astype(np.float32)
  b = rng.standard_normal((256, 16)).astype(np.float32)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  draws = 200
  noisy = jax.jit(jax.vmap(lambda k: ops.dense(a, b, fmt='bf16_noise', key=k)))(
    jax.random.split(jax.random.key(1), draws)
  )
  err = np.asarray(noisy, np.float64) - exact  # [draws, 32, 16]
  rounded = np.asarray(ops.dense(a, b, fmt='bf16'), np.float64) - exact

  def rms(e):
    return float(np.sqrt(np.mean(np.square(e))))

  assert 0.7 < rms(err) / rms(rounded) < 1.4, (rms(err), rms(rounded))  # the same magnitude
  bias = err.mean(axis=0)  # per output element, over draws: sd rms(err)/sqrt(draws) if unbiased
  assert rms(bias) < 1.3 * rms(err) / np.sqrt(draws), (rms(bias), rms(err))
  assert abs(bias.mean()) < 4 * rms(err) / np.sqrt(draws * bias.size)
  assert rms(rounded) > 5 * rms(err) / np.sqrt(draws)  # the same check would flag rounding's bias


def test_noise_control_forward_and_backward_noisy_and_keyed():
  rng = np.random.default_rng(1)
  x, k, dy = (rng.standard_normal(s).astype(np.float32) for s in ((8, 64), (64, 8), (8, 8)))

  def f64(v):
    return np.asarray(v, np.float64)

  exact = (f64(x) @ f64(k), f64(dy) @ f64(k).T, f64(x).T @ f64(dy))

  def run(key):
    y, vjp = jax.vjp(lambda u, v: ops.dense(u, v, fmt='bf16_noise', key=key), x, k)
    return (y,) + vjp(dy)

  first, again, other = run(jax.random.key(3)), run(jax.random.key(3)), run(jax.random.key(4))
  for got, same, moved, ref in zip(first, again, other, exact, strict=True):
    np.testing.assert_array_equal(got, same)  # one key: bit for bit
    rel = np.abs(f64(got) - ref).max() / np.abs(ref).max()
    assert 1e-4 < rel < 3e-2, rel  # noisy, at bf16's scale (eps 2^-8)
    assert not np.array_equal(got, moved)  # another key: other noise


def test_step_noise_keys_depend_on_seed_step_and_stream_only():
  def data(key):
    return np.asarray(jax.random.key_data(key))

  key = ops.step_noise_key
  assert np.array_equal(data(key(3, 5, 'train')), data(key(3, jnp.int32(5), 'train')))
  distinct = [
    key(3, 5, 'train'),
    key(3, 6, 'train'),
    key(4, 5, 'train'),
    key(3, 5, 'eval'),
    jax.random.fold_in(jax.random.key(3), 5),
  ]  # the flip key of step 5
  assert len({data(k).tobytes() for k in distinct}) == len(distinct)
  model = nnx.eval_shape(lambda: resnet.ResNet18(10, width=0.125, rngs=nnx.Rngs(0)))
  ids = {
    path: m.product_id
    for path, m in nnx.iter_modules(model)
    if isinstance(m, (layers.Conv2d, layers.Linear))
  }
  assert len(ids) == 21 and len(set(ids.values())) == 21  # 20 convolutions and the head
  assert ids[('fc',)] == layers.product_id(('fc',))
  with pytest.raises(ValueError, match='needs a noise key'):
    ops.noise_key('bf16_noise', 1)


def tiny_steps(seed, dense_format='bf16_noise'):
  """(state, train step, eval step, batch) of a tiny ResNet-18, by default with a noisy head (the
  noise of 20 noisy convolutions costs minutes of compile time here; their keys are tested
  above)."""
  config = resolved(f'numerics.dense_format={dense_format},optim.freeze_epochs=0')
  model = models.build(config, 10, 1, nnx.Rngs(0))
  tx = run.make_optimizer(config, 3, run.phases(config, 3)[0])
  state = train.create_train_state(model, tx)
  mask = run.trainable_mask(state['params'], False, config.model.reinit, resnet.PARTS)
  mesh = run.make_mesh(jax.devices()[:1])
  step = train.make_train_step(
    mesh, nnx.graphdef(model), tx, mask, 'classification', np.zeros(1), np.ones(1), False, seed
  )
  evaluate = train.make_eval_step(
    mesh, nnx.graphdef(model), 'classification', np.zeros(1), np.ones(1), seed
  )
  rng = np.random.default_rng(0)
  batch = {
    'image': rng.integers(0, 255, (8, 8, 8, 1), dtype=np.uint8),
    'label': rng.integers(0, 10, (8,)).astype(np.int32),
  }
  return state, step, evaluate, batch


def same(s, t):
  return all(
    np.array_equal(x, y) for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(t), strict=True)
  )


def test_noise_control_training_repeats_resumes_and_differs_per_seed():
  """Two train steps then an evaluation: repeated, and resumed (the second step from a host copy
  of the state), bit for bit; another seed gives other noise in training and in evaluation."""
  ends = {}
  for seed in (0, 1):
    state, train, evaluate, batch = tiny_steps(seed)
    saved = jax.device_get(train(state, batch))
    runs = []
    for _ in range(2):  # each from the host copy, as a resumed run
      end = train(jax.tree.map(jnp.asarray, saved), batch)
      totals, _ = evaluate(
        end, {**batch, 'mask': np.ones(8, np.float32)}, jax.tree.map(jnp.asarray, run.ZERO_SUMS)
      )
      runs.append(jax.device_get((end, totals)))
    assert same(runs[0], runs[1])
    ends[seed] = runs[0]
  (a, eval_a), (b, eval_b) = ends[0], ends[1]
  assert not np.array_equal(a['params']['fc']['kernel'], b['params']['fc']['kernel'])
  assert a['sums']['loss'] != b['sums']['loss'] and eval_a['loss'] != eval_b['loss']


def test_every_seed_of_an_arm_shares_one_compiled_step():
  """The seed is an argument of the compiled step, not a constant: the lowered train and eval
  steps are the same text for two seeds, noisy or not (one compilation per arm)."""

  def lowered(seed, fmt):
    state, train, evaluate, batch = tiny_steps(seed, fmt)
    totals = {k: jnp.zeros((), jnp.float32) for k in run.ZERO_SUMS}
    return (
      train.lower(state, batch).as_text(),
      evaluate.lower(state, {**batch, 'mask': jnp.ones(batch['label'].shape)}, totals).as_text(),
    )

  assert lowered(0, 'native') == lowered(1, 'native')
  assert lowered(0, 'bf16_noise') == lowered(1, 'bf16_noise')
  assert lowered(0, 'bf16_noise') != lowered(0, 'native')
