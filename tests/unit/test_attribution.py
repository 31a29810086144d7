"""analysis.attribution, its renderer and forest plot on synthetic runs with planted effects
(fixed RNG). The gap decomposition's verdicts and share: tests/unit/test_gap.py."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats as sps

from analysis import analyse, attribute, attribution, declaration, draw, report
from runrecord import record

METRIC = 'final.test_accuracy'
PROFILE = 'numerics.requested.profile'
# Planted effects in pp of accuracy: the emulated TPU format is +0.8 pp above f32; everything
# else 0.
EFFECT = {'f32': 0.0, 'tpu_default': 0.8, 'jax_gpu_default': 0.0, 'noise': 0.0}
EMULATES = {'tpu': 'tpu_default', 'gpu': 'jax_gpu_default'}
SEED_SD, RUN_SD, BASE = 0.7, 0.1, 90.0


def runs_frame(
  platforms=('gpu', 'tpu'), seeds=range(8), native=True, platform_shift=0.0, rng=0, seed_sd=SEED_SD
):
  """A runs table: every seed on every platform x profile; `bn` a zero-effect factor; TPU runs
  shifted by `platform_shift` pp (a platform residual); the native arm = that platform's format."""
  rng = np.random.default_rng(rng)
  seed_effect = rng.normal(0, seed_sd, max(seeds) + 1)
  profiles = list(EFFECT) + (['native'] if native else [])
  rows = []
  for platform in platforms:
    for i, profile in enumerate(profiles):
      for seed in seeds:
        effect = EFFECT[EMULATES[platform] if profile == 'native' else profile]
        pp = (
          BASE
          + effect
          + seed_effect[seed]
          + (platform == 'tpu') * platform_shift
          + rng.normal(0, RUN_SD)
        )
        rows.append(
          {
            'run': f'/r/{platform}/{profile}/{seed}',
            'status': 'completed',
            'reason': '',
            'seed': seed,
            'platform': platform,
            PROFILE: profile,
            'numerics.requested.batchnorm_group': (i + seed) % 2,
            METRIC: pp / 100,
          }
        )
  return pd.DataFrame(rows)


def show(out):
  text = report.attribution_report(out)
  print(text)
  return text


def term(out, name):
  return out.terms.set_index('term').loc[name]


def residual(out):
  gap = out.gap
  return gap[gap['kind'] == 'residual'].iloc[0]


def test_planted_effects_inside_their_cis_and_match_statsmodels_mixedlm():
  frame = runs_frame(native=False)
  out = attribution.factor_attribution(
    frame,
    ['platform', 'profile', 'batchnorm_group'],
    reference={'profile': 'f32'},
    margin=0.3,
    noise_arm=['profile=noise'],
  )
  show(out)
  assert out.method.startswith('MixedLM (REML)')
  terms = out.terms.set_index('term')
  planted = {
    'profile=tpu_default': 0.8,
    'profile=jax_gpu_default': 0,
    'profile=noise': 0,
    'platform=tpu': 0,
    'batchnorm_group=1': 0,
  }
  assert set(terms.index) == set(planted)
  for name, value in planted.items():
    assert terms.loc[name, 'ci_low'] < value < terms.loc[name, 'ci_high'], name
  assert terms.loc['profile=tpu_default', 'p'] < 1e-6
  # The same model written as a statsmodels formula, fitted independently.
  data = frame.assign(
    v=100 * frame[METRIC], profile=frame[PROFILE], bn=frame['numerics.requested.batchnorm_group']
  )
  ref = smf.mixedlm(
    "v ~ C(platform) + C(profile, Treatment('f32')) + C(bn)", data, groups=data['seed']
  ).fit(reml=True)
  name = "C(profile, Treatment('f32'))[T.tpu_default]"
  low, high = ref.conf_int().loc[name]
  assert terms.loc['profile=tpu_default', 'estimate'] == pytest.approx(ref.params[name], abs=1e-4)
  assert terms.loc['profile=tpu_default', ['ci_low', 'ci_high']].tolist() == pytest.approx(
    [low, high], abs=1e-4
  )
  # The noise floor, per platform, paired by seed: noise − f32 (the reference arm), by hand.
  data = data.pivot_table(index='seed', columns=['platform', 'profile'], values='v')
  for platform in ('gpu', 'tpu'):
    d = data[platform, 'noise'] - data[platform, 'f32']
    floor = out.noise[platform]
    assert floor.what == 'profile=noise − profile=f32' and floor.n == 8
    assert floor.sd == pytest.approx(d.std(ddof=1), rel=1e-12)
    assert floor.half == pytest.approx(2.364624 * d.std(ddof=1) / np.sqrt(8), rel=1e-6)
    assert floor.sd != pytest.approx(data[platform, 'noise'].std(ddof=1), rel=0.05)


def test_zero_platform_residual_is_explained_by_numerics():
  out = attribution.factor_attribution(
    runs_frame(), ['platform', 'profile'], reference={'profile': 'f32'}, margin=0.3
  )
  show(out)
  gap = out.gap.set_index('key')
  numerics = gap.loc['N']
  assert (
    numerics['component'] == 'numerics part: tpu_default − jax_gpu_default, mean of both platforms'
  )
  assert numerics['ci_low'] < 0.8 < numerics['ci_high']
  r = residual(out)
  assert r['ci_low'] < 0 < r['ci_high'] and r['tost_p'] < 0.05
  assert -0.3 < r['ci90_low'] and r['ci90_high'] < 0.3
  assert out.decomposition[0].verdict == 'explained by numerics'
  assert '**tpu − gpu: explained by numerics**' in show(out)
  assert out.emulation == {'gpu': 'jax_gpu_default', 'tpu': 'tpu_default'}  # the default mapping
  assert 'gpu=jax_gpu_default, tpu=tpu_default' in show(out)
  assert gap.loc['G', 'estimate'] == pytest.approx(numerics['estimate'] + r['estimate'])


def test_planted_platform_residual_leaves_the_gap_partly_explained():
  out = attribution.factor_attribution(
    runs_frame(platform_shift=1.5),
    ['platform', 'profile'],
    reference={'profile': 'f32'},
    margin=0.3,
    platform_profile={'tpu': 'tpu_default', 'gpu': 'jax_gpu_default'},
  )
  assert 'native arithmetic: gpu=jax_gpu_default, tpu=tpu_default. Each component' in show(out)
  r = residual(out)
  assert r['ci_low'] < 1.5 < r['ci_high'] and r['ci_low'] > 0.3
  assert out.decomposition[0].verdict == 'partly explained'  # 0.8 of 2.3 pp: numerics
  assert 'explained by numerics**' not in show(out)


def test_failed_mixed_fit_falls_back_to_clustered_ols_and_says_so(monkeypatch):
  def boom(*args, **kwargs):
    raise np.linalg.LinAlgError('Singular matrix')

  monkeypatch.setattr(attribution.sm, 'MixedLM', boom)
  frame = runs_frame(rng=3)
  out = attribution.factor_attribution(
    frame, ['platform', 'profile'], reference={'profile': 'f32'}, margin=0.3
  )
  show(out)
  assert 'mixed fit failed (LinAlgError: Singular matrix)' in out.method
  assert 'clustered by seed' in out.method and 'method: OLS with seed fixed effects' in show(out)
  # The main terms against statsmodels' own formula OLS with seed dummies and the same clustered
  # sandwich, its CR1 factor counting the factor columns only (5: the seed effects are nested in
  # their clusters, tests/unit/test_analysis_scale.py).
  data = frame.assign(v=100 * frame[METRIC], profile=frame[PROFILE])
  ref = smf.ols("v ~ C(platform) + C(profile, Treatment('f32')) + C(seed)", data).fit(
    cov_type='cluster', cov_kwds={'groups': data['seed'], 'use_correction': False}, use_t=True
  )
  name = "C(profile, Treatment('f32'))[T.tpu_default]"
  t = term(out, 'profile=tpu_default')
  n, g = len(data), data['seed'].nunique()
  se = ref.bse[name] * np.sqrt(g / (g - 1) * (n - 1) / (n - 5))
  half = sps.t.ppf(0.975, g - 1) * se
  assert [t['estimate'], t['se'], t['ci_low'], t['ci_high']] == pytest.approx(
    [ref.params[name], se, ref.params[name] - half, ref.params[name] + half], rel=1e-6
  )
  # The residual is the mean over seeds of a per-seed contrast d of raw values, with the t-interval
  # over seeds (no model): se = sd(d) / sqrt(seeds), seeds - 1 df.
  cell = data.pivot_table(index='seed', columns=['platform', 'profile'], values='v')
  d = (
    cell['tpu', 'native']
    - cell['gpu', 'native']
    - 0.5 * (cell['tpu', 'tpu_default'] - cell['tpu', 'jax_gpu_default'])
    - 0.5 * (cell['gpu', 'tpu_default'] - cell['gpu', 'jax_gpu_default'])
  )
  r = residual(out)
  assert r['estimate'] == pytest.approx(d.mean(), abs=1e-9)
  assert r['se'] == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)), rel=1e-9)
  assert r['df'] == len(d) - 1


def test_zero_seed_variance_is_a_boundary_fit_and_falls_back():
  frame = runs_frame(native=False, platforms=('gpu',), seeds=range(4), seed_sd=0.0)
  out = attribution.factor_attribution(frame, ['profile'], reference={'profile': 'f32'})
  assert 'mixed fit failed' in out.method and 'boundary' in out.method


def test_csv_without_seed_column_uses_hc3(tmp_path, capsys):
  frame = runs_frame(platforms=('gpu',), native=False).drop(columns=['seed', 'run', 'status'])
  frame = frame.rename(columns={METRIC: 'acc', PROFILE: 'fmt'})[['platform', 'fmt', 'acc']]
  path = tmp_path / 'published.csv'
  frame.to_csv(path, index=False)
  attribute.main(
    ['--csv', str(path), '--metric', 'acc', '--factors', 'fmt', '--reference', 'fmt=f32']
  )
  text = capsys.readouterr().out
  assert 'no seed column' in text and 'HC3' in text and '(1 | seed)' not in text
  assert 'runs from one platform (gpu)' in text
  data = frame.assign(v=100 * frame['acc'])
  ref = smf.ols("v ~ C(fmt, Treatment('f32'))", data).fit(cov_type='HC3', use_t=True)
  low, high = ref.conf_int().loc["C(fmt, Treatment('f32'))[T.tpu_default]"]
  assert f'| fmt=tpu_default | {ref.params.iloc[-1]:.2f} | [{low:.2f}, {high:.2f}] |' in text


def test_one_platform_compares_arms_with_the_reference_arm():
  out = attribution.factor_attribution(
    runs_frame(platforms=('tpu',)),
    ['platform', 'profile'],
    reference={'profile': 'f32'},
    margin=0.3,
  )
  assert out.gap is None and out.gap_note.startswith('runs from one platform (tpu)')
  assert out.decomposition == []
  arms = out.arms.set_index('arm')
  assert arms.loc['platform=tpu, profile=tpu_default', 'estimate'] == pytest.approx(
    term(out, 'profile=tpu_default')['estimate']
  )
  assert 'platform=tpu' not in set(out.terms['term'])  # one level: no term


def test_files_written_with_exact_csv_columns(tmp_path):
  frame = runs_frame()
  frame.loc[0, 'status'], frame.loc[0, 'reason'] = 'failed', 'loss is NaN'
  frame.loc[1, METRIC] = np.inf
  out = attribution.factor_attribution(
    frame,
    ['platform', 'profile'],
    reference={'profile': 'f32'},
    margin=0.3,
    noise_arm={'profile': 'noise'},
  )
  attribute.write(out, str(tmp_path))
  table = pd.read_csv(tmp_path / 'attribution.csv')
  assert list(table.columns) == ['term', 'estimate', 'ci_low', 'ci_high', 'p']
  assert table['term'].tolist() == out.terms['term'].tolist() and len(table) == 5
  for name in (
    'attribution.md',
    'attribution_gap.csv',
    'attribution_decomposition.csv',
    'attribution_forest.pdf',
    'attribution_forest.png',
    'gap_decomposition.pdf',
    'gap_decomposition.png',
  ):
    assert (tmp_path / name).stat().st_size > 500, name
  decomposition = pd.read_csv(tmp_path / 'attribution_decomposition.csv').iloc[0]
  assert (
    decomposition['verdict'] == out.decomposition[0].verdict and decomposition['gap'] == 'tpu - gpu'
  )
  assert {'share', 'share_ci_low', 'seeds_for_residual_within_margin'} <= set(decomposition.index)
  assert len(out.excluded) == 2 and 'failed: loss is NaN' in show(out)
  assert 'no value for final.test_accuracy' in show(out)


@pytest.mark.parametrize(
  'argv, message',
  [
    (['--factors', 'nosuch'], 'error: --factors: no column'),
    (
      ['--factors', 'profile', '--reference', 'profile=bf17'],
      'error: --reference: profile has no level',
    ),
    (
      ['--factors', 'profile', '--margin', '-1'],
      'error: argument --margin: -1.0 is not a usable margin',
    ),
    (['--factors', 'profile', '--noise-arm', 'noise'], 'error: --noise-arm: '),
    (['--factors', 'profile', '--native', 'profile=nope'], 'error: --native: profile has no level'),
    (['--factors', 'profile', '--interactions', 'profile'], 'error: --interactions: '),
    (
      ['--factors', 'profile', '--platform-profile', 'gpu=nope'],
      "error: --platform-profile: profile has no level 'nope'",
    ),
    (
      ['--factors', 'profile', '--platform-profile', 'gpuu=f32'],
      'error: --platform-profile: no runs on gpuu; platforms: gpu, tpu',
    ),
    (['--factors'], 'error: argument --factors: expected at least one argument'),
  ],
)
def test_bad_flags_one_line_error_exit_2(tmp_path, capsys, argv, message):
  path = tmp_path / 'runs.csv'
  runs_frame(seeds=range(3)).to_csv(path, index=False)
  with pytest.raises(SystemExit) as e:
    attribute.main(['--csv', str(path)] + argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(message) and err.count('\n') == 1, err


def test_a_declared_study_runs_the_attribution_with_its_settings(tmp_path, capsys):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(
    'def get_config(arg=None):\n  return None\n\n\ndef get_study(arg=None):\n'
    "  return {'margin': 0.25, 'margin_reason': 'half the seed sd', "
    "'factors': ['platform', 'profile'], 'reference': {'profile': 'f32'}, "
    "'noise_arm': {'profile': 'noise'}, 'native': {'profile': 'native'}, "
    "'platform_profile': {'tpu': 'tpu_default', 'gpu': 'jax_gpu_default', "
    "'cpu': 'f32'}, 'labels': {'profile': '{}'}}\n"
  )  # cpu has no runs
  declared = declaration.load(f'{cfg}:x')
  frame = runs_frame(seeds=range(4)).drop(columns='numerics.requested.batchnorm_group')
  out = analyse.study_analysis(frame, declared)
  att = out.attribution
  assert att.margin == 0.25 and att.margin_reason == 'half the seed sd'
  assert att.emulation == {'gpu': 'jax_gpu_default', 'tpu': 'tpu_default'}
  assert att.labels['profile=tpu_default'] == 'tpu_default'
  assert att.labels['platform=tpu'] == 'platform tpu'
  text = show(att)
  assert (
    '±0.25 pp (half the seed sd)' in text and '| platform residual: gap − numerics part |' in text
  )
  cfg.write_text(
    'def get_config(arg=None):\n  return None\n\n\ndef get_sweep(arg=None):\n  return []\n'
  )
  assert declaration.load(f'{cfg}:x') == {}


def test_cli_on_saved_runs_writes_the_outputs(tmp_path, capsys):
  for i, (profile, seed, acc) in enumerate(
    [
      ('f32', 0, 0.90),
      ('f32', 1, 0.91),
      ('tpu_default', 0, 0.908),
      ('tpu_default', 1, 0.919),
      ('f32', 2, 0.905),
    ]
  ):
    record.write_results(
      str(tmp_path / 'runs' / f'r{i}'),
      {
        'status': 'failed' if i == 4 else 'completed',
        'reason': 'loss is NaN' if i == 4 else '',
        'seed': seed,
        'platform': 'cpu',
        'numerics': {'requested': {'profile': profile}},
        'final': {'test_accuracy': acc},
      },
    )
  attribute.main(
    [
      '--runs',
      str(tmp_path / 'runs'),
      '--factors',
      'profile',
      '--margin',
      '0.5',
      '--out',
      str(tmp_path / 'out'),
    ]
  )
  text = capsys.readouterr().out
  assert 'runs: 4 used, 1 excluded' in text and 'failed: loss is NaN' in text
  assert '| profile=tpu_default | 0.85 |' in text  # both seeds are +0.8 and +0.9 pp
  assert 'one run per seed' not in text and (tmp_path / 'out' / 'attribution_forest.png').exists()
  assert not (tmp_path / 'out' / 'gap_decomposition.png').exists()  # one platform: no gap


def test_every_analysis_command_prints_its_help(capsys):
  """--help of each command names the command as it is run (`python -m analysis.NAME`)."""
  for name, module in (('analyse', analyse), ('attribute', attribute), ('draw', draw)):
    with pytest.raises(SystemExit) as done:
      module.parse_args(['--help'])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f'usage: python -m analysis.{name} '), name
