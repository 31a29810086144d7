"""experiments/divergence's parts, mostly without training: the pair list and the ceiling arm, the
final test counts, disagreement against statsmodels, bands and parameter distances by hand, the
default control arm, the progress rate, matmul-precision arms in the lowered HLO, bad arguments.

Tiny: the digits `smoke` preset (width 0.125, 8x8 images), a few steps, one device.
"""

import math

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import stats as scipy_stats
from statsmodels.stats.proportion import proportion_confint

from experiments import divergence, lockstep
from numerics import setup as numerics_setup
from tests.support.divergence_runs import SMOKE, run_main
from trainer import run, train


def arm_configs(config, settings, seeds):
  """{seed: {arm: resolved config}} as experiments.divergence builds them."""
  return {
    seed: {n: divergence.arm_config(config, s, f'--{n}', seed) for n, s in settings.items()}
    for seed in seeds
  }


def test_pair_list():
  def kinds(seeds, names):
    return [(p['kind'], p['x'], p['y']) for p in lockstep.pair_list(seeds, names)]

  assert kinds([7], ['a', 'b']) == [('b', (7, 'a'), (7, 'b'))]
  assert kinds([1, 2], ['a', 'b', 'control'])[-1:] == [('ceiling', (1, 'a'), (2, 'a'))]
  assert kinds([0, 1, 2], ['a', 'b'])[3:] == [
    ('ceiling', (0, 'a'), (1, 'a')),
    ('ceiling', (1, 'a'), (2, 'a')),
    ('ceiling', (2, 'a'), (0, 'a')),
  ]


def test_ceiling_arm_has_other_initial_weights_and_data_order():
  config = divergence.load_config(SMOKE)
  configs = arm_configs(config, {n: {'numerics.profile': 'f32'} for n in 'ab'}, [0, 1])
  lock = lockstep.prepare(configs, devices=1)
  ceiling = [p for p in lock['pairs'] if p['kind'] == 'ceiling']
  assert [(p['x'], p['y']) for p in ceiling] == [((0, 'a'), (1, 'a'))]
  assert [lock['arms'][s, 'a']['ctx'].config.seed for s in (0, 1)] == [0, 1]
  params = {s: lockstep.flat(jax.device_get(lock['states'][s, 'a']['params'])) for s in (0, 1)}
  assert all(not np.array_equal(params[0][k], params[1][k]) for k in params[0] if 'kernel' in k)
  batches = [
    jax.device_get(next(run.batches(lock['arms'][s, 'a']['ctx'], 0, 1))['image']) for s in (0, 1)
  ]
  assert not np.array_equal(*batches)
  seed1_b = jax.device_get(lock['states'][1, 'b']['params'])
  assert all(np.array_equal(params[1][k], v) for k, v in lockstep.flat(seed1_b).items())


def test_final_test_counts_every_test_image():
  """Whole-test-set disagreement of untrained arms against predictions computed here directly,
  in one batch; the intervals are statsmodels' Wilson intervals; the noisy control's accuracy is
  the trainer's evaluation's (the same eval noise)."""
  config = divergence.load_config(SMOKE, [('eval_batch_size', '128')])  # 360 = 2 x 128 + 104
  configs = arm_configs(
    config,
    {
      n: {'numerics.profile': p}
      for n, p in (('a', 'f32'), ('b', 'tpu_default'), ('control', 'bf16_noise'))
    },
    [0, 1],
  )
  lock = lockstep.prepare(configs, devices=1)
  final = lockstep.final_test(lock)
  test = lock['ctx'].dataset.test
  for seed in (0, 1):
    ctx, state = lock['arms'][seed, 'control']['ctx'], lock['states'][seed, 'control']
    evaluated, _ = train.evaluate(ctx, train.eval_fn(ctx, state), state)
    # Equal counts of correct images (the evaluation sums them in float32).
    assert final['accuracy']['control']['per_seed'][seed] == pytest.approx(
      evaluated['test_accuracy'], abs=1e-7
    )
  preds = {}
  for (seed, name), arm in ((i, a) for i, a in lock['arms'].items() if i[1] != 'control'):
    ctx, state = arm['ctx'], lock['states'][seed, name]

    def logits_of(params, batch_stats, images, ctx=ctx):
      model = nnx.merge(ctx.graphdef, params, batch_stats)
      model.eval()
      return model(train.preprocess(images, ctx.mean, ctx.std))

    with numerics_setup.precision_scope(ctx.config):
      logits = jax.jit(logits_of)(state['params'], state['batch_stats'], np.asarray(test.images))
    preds[seed, name] = np.argmax(np.asarray(logits), axis=-1)
  assert final['test_count'] == len(test) == 360
  for kind, x, y in (('b', (0, 'a'), (0, 'b')), ('ceiling', (0, 'a'), (1, 'a'))):
    pair = final['disagreement'][kind]['pairs'][0]
    assert pair['n'] == 360 and pair['count'] == int(np.sum(preds[x] != preds[y]))
    low, high = proportion_confint(pair['count'], 360, alpha=0.05, method='wilson')
    assert (pair['ci_low'], pair['ci_high']) == (low, high)
  acc = np.mean(preds[0, 'a'] == np.asarray(test.labels))
  assert final['accuracy']['a']['per_seed'][0] == pytest.approx(acc)
  assert final['disagreement']['ceiling']['pairs'][0]['count'] > 100


def test_disagreement_matches_statsmodels():
  pairs = [
    {'seeds': [0, 0], 'count': 3, 'n': 360},
    {'seeds': [1, 1], 'count': 0, 'n': 360},
    {'seeds': [2, 2], 'count': 12, 'n': 360},
  ]
  out = lockstep.disagreement(pairs)
  for p, q in zip(pairs, out['pairs'], strict=True):
    assert q['rate'] == p['count'] / 360
    assert (q['ci_low'], q['ci_high']) == proportion_confint(p['count'], 360, method='wilson')
  assert out['total'] == {'count': 15, 'n': 1080}
  rates = np.array([3, 0, 12]) / 360
  assert out['band']['mean'] == pytest.approx(rates.mean())
  assert (out['band']['min'], out['band']['max']) == (0.0, rates.max())
  # Across seeds: the t-Wilson interval over the three seeds' rates (the t-interval reshaped to
  # stay above 0: the plain one starts below 0 here), not a Wilson interval over the 1080 images
  # pooled (the nearest wrong version: about 4x narrower here).
  across = out['across']
  half = scipy_stats.t.ppf(0.975, 2) * rates.std(ddof=1) / math.sqrt(3)
  assert across['pairs'] == 3 and across['mean'] == pytest.approx(rates.mean())
  k = half**2 / (rates.mean() * (1 - rates.mean()))
  roots = sorted(np.roots([1 + k, -(2 * rates.mean() + k), rates.mean() ** 2]))
  assert (across['t_low'], across['t_high']) == pytest.approx(roots)
  assert rates.mean() - half < 0 < across['t_low']
  low, high = proportion_confint(15, 1080, alpha=0.05, method='wilson')
  assert across['t_high'] - across['t_low'] > 3 * (high - low)
  differs = lockstep.differs(
    np.array([[1, 0], [1, 1], [0, 0]]) > 0, np.array([[1, 1], [1, 1], [0, 0]]) > 0
  )
  assert differs.tolist() == [0.5, 0.0, 0.0]  # multilabel: the share of its labels


def test_ceiling_pairs_sharing_a_seed_are_left_out_of_the_interval_over_seeds():
  pairs = [
    {'seeds': [0, 1], 'count': 30, 'n': 360},
    {'seeds': [1, 2], 'count': 50, 'n': 360},
    {'seeds': [2, 3], 'count': 40, 'n': 360},
    {'seeds': [3, 0], 'count': 60, 'n': 360},
  ]
  out = lockstep.disagreement(pairs)
  assert out['across']['pairs'] == 2  # (0, 1) and (2, 3): independent
  assert out['across']['mean'] == pytest.approx((30 + 40) / 720)
  assert out['band']['mean'] == pytest.approx(180 / 1440)  # every pair, for the min–max band


def test_band_by_hand():
  values = [0.5, 0.25, None, 1.0, 0.75]  # None: a value not defined (e.g. no loss yet)
  x = np.array([0.5, 0.25, 1.0, 0.75])
  b = lockstep.band(values)
  sd = math.sqrt(np.sum((x - x.mean()) ** 2) / 3)
  half = scipy_stats.t.ppf(0.975, 3) * sd / 2  # sqrt(4) = 2
  assert b['n'] == 4 and b['mean'] == 0.625 and (b['min'], b['max']) == (0.25, 1.0)
  assert b['sd'] == pytest.approx(sd, rel=1e-12)
  assert (b['t_low'], b['t_high']) == pytest.approx((0.625 - half, 0.625 + half), rel=1e-12)
  one = lockstep.band([2.0])
  assert (one['mean'], one['min'], one['max'], one['sd'], one['t_low']) == (
    2.0,
    2.0,
    2.0,
    None,
    None,
  )
  assert lockstep.band([None])['mean'] is None


def test_param_distance_by_hand():
  rng = np.random.default_rng(0)
  a = {
    'conv1': {'kernel': rng.standard_normal((3, 3, 1, 2)).astype(np.float32)},
    'bn1': {'scale': np.ones(2, np.float32)},
    'layer1': {0: {'conv1': {'kernel': rng.standard_normal((3, 3, 2, 2)).astype(np.float32)}}},
    'fc': {'kernel': rng.standard_normal((2, 3)).astype(np.float32)},
  }
  b = jax.tree.map(lambda x: x.copy(), a)
  b['layer1'][0]['conv1']['kernel'][0, 0, 0, 0] += 0.5
  b['bn1']['scale'][1] = -1.0
  out = lockstep.param_distance(a, b)
  flat_a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(a)]).astype(np.float64)
  flat_b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(b)]).astype(np.float64)
  assert out['rel_l2'] == pytest.approx(np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_a))
  assert out['max_abs'] == 2.0
  stem_norm = np.sqrt(np.sum(np.square(a['conv1']['kernel'], dtype=np.float64)) + 2.0)
  assert out['groups']['stem']['rel_l2'] == pytest.approx(2.0 / stem_norm)
  assert out['groups']['layer1']['diff_norm'] == pytest.approx(0.5)
  assert out['groups']['head']['diff_norm'] == 0.0
  assert list(out['groups']) == ['stem', 'layer1', 'head']


def test_default_control_is_the_noise_arm():
  args, _ = divergence.parse_args(
    ['--config=x.py', '--a', 'profile=f32', '--b', 'profile=tpu_default']
  )
  assert divergence.settings(args)['control'] == {'numerics.profile': 'bf16_noise'}
  args, _ = divergence.parse_args(['--config=x.py', '--a', 'profile=f32', '--control', 'none'])
  assert list(divergence.settings(args)) == ['a', 'b']
  args, _ = divergence.parse_args(
    [
      '--config=x.py',
      '--a',
      'conv_format=tf32,dense_format=tf32,compute_dtype=bfloat16',
      '--control',
      'conv_format=bf16_3x,dense_format=bf16_3x',
    ]
  )
  assert divergence.settings(args)['control'] == {
    'numerics.conv_format': 'bf16_3x',
    'numerics.dense_format': 'bf16_3x',
    'numerics.compute_dtype': 'bfloat16',
  }
  # The default control's profile replaces arm a's own formats.
  args, _ = divergence.parse_args(['--config=x.py', '--a', 'conv_format=tf32,batchnorm_group=4'])
  assert divergence.settings(args)['control'] == {
    'numerics.batchnorm_group': '4',
    'numerics.profile': 'bf16_noise',
  }


def test_determinism_check_of_a_profile_arm_with_the_default_control():
  """`--a numerics.profile=native` (a determinism check of a profile arm) resolves with the default
  noise control, which used to contradict it (the control's profile replaces arm a's)."""
  args, _ = divergence.parse_args([f'--config={SMOKE}', '--a', 'numerics.profile=native'])
  arms = divergence.settings(args)
  assert arms['control'] == {'numerics.profile': 'bf16_noise'}
  config = divergence.load_config(SMOKE)
  control = divergence.arm_config(config, arms['control'], '--control', 0)
  assert (control.numerics.conv_format, control.numerics.dense_format) == ('bf16_noise',) * 2
  assert divergence.arm_config(config, arms['a'], '--a', 0).numerics.conv_format == 'native'


def test_progress_rate_leaves_out_the_compile_and_says_the_eta():
  now, lines = [100.0], []
  progress = lockstep.Progress(lines.append, interval=10.0, clock=lambda: now[0])
  assert progress.rate(1, 50) == 'step 1/50, steps/s: measuring (compiling)'
  now[0] = 160.0  # the first step compiled for a minute
  progress.compiled(1)
  progress.step(1, 50)  # over 10 s since the last line: one now, with no rate yet
  now[0] = 164.0
  progress.step(9, 50)  # 4 s since the last line: nothing
  now[0] = 170.0  # 10 steps after the compile in 10 s
  progress.step(11, 50)
  assert lines == [
    '[1m00s] step 1/50, steps/s: measuring (compiling)',
    '[1m10s] step 11/50, 1 steps/s, ETA 0m39s',
  ]
  now[0] = 100.0 + 3660.4  # past an hour: hours, as the sweep's lines count them
  progress.say('still here')
  assert lines[-1] == '[1h1m00s] still here'


def test_matmul_precision_arms_lower_to_different_hlo():
  config = divergence.load_config(SMOKE)
  configs = arm_configs(
    config,
    {n: {'numerics.matmul_precision': p} for n, p in (('a', 'default'), ('b', 'highest'))},
    [0],
  )
  lock = lockstep.prepare(configs, devices=1)
  fns = lockstep.enter_phase(lock, lock['ctx'].phases[0], 0)
  batch = next(run.batches(lock['arms'][0, 'a']['ctx'], 0, 1))
  # Lowered outside any precision context: each arm's step fixes its own precision inside.
  texts = {name: fns[0, name].lower(lock['states'][0, name], batch).as_text() for name in 'ab'}
  assert fns[0, 'a'] is not fns[0, 'b'] and texts['a'] != texts['b']
  dots = {n: [line for line in t.splitlines() if 'dot_general' in line] for n, t in texts.items()}
  assert dots['a'] and all('HIGHEST' not in line for line in dots['a'])
  assert dots['b'] and all('HIGHEST' in line for line in dots['b'])
  assert lock['numerics']['b']['effective']['matmul_precision_flag'] == 'highest'


@pytest.mark.parametrize(
  'argv,expect',
  [
    (['--config=configs/nope.py', '--a', 'profile=f32'], '--config: no file configs/nope.py'),
    (['--a', 'model.width=0.5'], '--a: model.width is not a numerics field'),
    (['--a', 'profile'], '--a=profile: give numerics.<field>=<value>'),
    (['--a', 'profile=fp8'], '--a: config.numerics.profile must be one of'),
    (['--a', 'emulate=f32'], '--a: config.numerics.emulate: numerics.emulate was replaced'),
    (['--a', 'profile=f32', '--b', 'numerics.nope=1'], '--b: unknown config field numerics.nope'),
    (['--a', 'profile=f32', '--b', 'gpu_deterministic=True'], '--b: numerics.gpu_deterministic is'),
    (['--a', 'profile=f32', '--steps', '0'], '--steps=0: give a positive integer'),
    (['--a', 'profile=f32', '--num-seeds', '0'], '--num-seeds=0: give a positive integer'),
    (['--a', 'profile=f32', '--seeds', '1', '1'], '--seeds=1 1: give distinct non-negative'),
    (
      ['--a', 'profile=f32', '--seeds', '1', '--num-seeds', '2'],
      'argument --num-seeds: not allowed with argument --seeds',
    ),
    (['--a', 'profile=f32', '--control', 'model.width=1'], '--control: model.width is not a'),
    (
      ['--a', 'profile=f32', '--control', 'conv_format=fp8'],
      '--control: config.numerics.conv_format must be one of',
    ),
    (['--a', 'profile=f32', '--every', 'x'], "argument --every: invalid int value: 'x'"),
    (['--a', 'profile=f32', '--config.model.nope=1'], '--config.model.nope: unknown config field'),
    (['--a', 'profile=f32', '--config.batch_size=0'], 'config.batch_size must be a positive'),
    (['--a', 'profile=f32', '--bogus'], 'unrecognized argument --bogus'),
    (['--a', 'profile=f32', '--devices', '3'], '--devices=3: give 0'),
    (['--a', 'profile=f32', '--steps', '100000'], '--steps=100000: give 1..44'),
    (
      ['--a', 'param_dtype=float32', '--b', 'param_dtype=bfloat16'],
      'parameter bn1.bias is float32[8] in arm a, bfloat16[8] in arm b',
    ),
  ],
)
def test_bad_arguments_rejected(argv, expect, tmp_path, capsys):
  if not any(a.startswith('--config=') for a in argv):
    argv = [f'--config={SMOKE}', *argv]
  with pytest.raises(SystemExit) as exit_info:
    run_main([*argv, '--out', str(tmp_path / 'out')])
  assert exit_info.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert expect in lines[-1] and lines[-1].startswith('error: '), lines
  assert all(line.startswith('[') for line in lines[:-1]), lines  # only progress lines before it
  assert not (tmp_path / 'out').exists()
