"""The platform gap (analysis/attribution.py) on planted two-platform studies where
the estimand matters: the native arms' own paired gap, not a platform term pooled over every arm
with profile=native; the exact per-seed identity G = fid_A - fid_B + N + P; verdicts that cannot
call a gap beyond the margin "no gap" or a gap the numerics explain a quarter of "explained";
unequal arm variances; Fieller's share interval at the shipped regime (G/se about 2.5)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import analyse, attribution, report, stats

METRIC = 'final.test_accuracy'
COL = {
  'profile': 'numerics.requested.profile',
  'batchnorm_group': 'numerics.requested.batchnorm_group',
  'compute_dtype': 'numerics.requested.compute_dtype',
}
EMULATES = {'gpu': 'jax_gpu_default', 'cpu': 'f32'}
FACTORS = ['platform', 'profile', 'batchnorm_group', 'compute_dtype']
REFERENCE = {'profile': 'native', 'batchnorm_group': '0', 'compute_dtype': 'float32'}
# the arms of configs/digits.py's fraction that matter here: three profiles at the reference
# levels, and two more arms with profile=native (BN/16, bf16 activations)
ARMS = [
  ('native', '0', 'float32'),
  ('jax_gpu_default', '0', 'float32'),
  ('f32', '0', 'float32'),
  ('native', '16', 'float32'),
  ('native', '0', 'bfloat16'),
]


def delta_ratio(num, den, level=0.95):
  """(s, low, high): the delta-method interval of mean(num) / mean(den) (paired), the nearest wrong
  version Fieller's is tested against: it under-covers when the denominator's t is small."""
  num, den = np.asarray(num, float), np.asarray(den, float)
  k = len(num)
  s = num.mean() / den.mean()
  se = np.std(num - s * den, ddof=1) / np.sqrt(k) / abs(den.mean())
  half = sps.t.ppf(0.5 + level / 2, k - 1) * se
  return s, s - half, s + half


def planted(shift, sd=None, seeds=12, rng=0, seed_sd=0.8, base=90.0):
  """Runs of ARMS on gpu and cpu: value (pp) = base + seed effect + shift[(platform, arm)] + noise
  of sd[(platform, arm)] (default 0.3)."""
  rng = np.random.default_rng(rng)
  seed_effect = rng.normal(0, seed_sd, seeds)
  rows = []
  for platform in ('gpu', 'cpu'):
    for arm in ARMS:
      for s in range(seeds):
        pp = (
          base
          + seed_effect[s]
          + shift.get((platform, arm), 0.0)
          + rng.normal(0, (sd or {}).get((platform, arm), 0.3))
        )
        rows.append(
          {
            'run': f'/r/{platform}/{"_".join(arm)}/{s}',
            'status': 'completed',
            'seed': s,
            'platform': platform,
            **dict(zip(COL.values(), arm, strict=True)),
            METRIC: pp / 100,
          }
        )
  return pd.DataFrame(rows)


def run(frame, margin=0.5, **kw):
  out = attribution.factor_attribution(
    frame,
    FACTORS,
    reference=REFERENCE,
    margin=margin,
    native={'profile': 'native'},
    platform_profile=EMULATES,
    **kw,
  )
  (d,) = out.decomposition
  return out, d


def hand(frame, platform, arm):
  """The cell's values by seed (pp), straight from the raw table."""
  rows = frame[
    (frame['platform'] == platform) & (frame[list(COL.values())] == list(arm)).all(axis=1)
  ]
  return (100 * rows.set_index('seed')[METRIC]).sort_index()


NATIVE, EMU_GPU, F32, BN16, BF16 = ARMS


def test_the_gap_is_the_native_arms_paired_gap_not_a_pooled_platform_term():
  """Only the native arm differs between the platforms (+1.2 pp): the answer is its gap. The old
  estimand (the platform term over every profile=native arm: native, BN/16, bf16 activations)
  gave about a third of it."""
  frame = planted({('gpu', NATIVE): 1.2})
  out, d = run(frame)
  by_hand = hand(frame, 'gpu', NATIVE) - hand(frame, 'cpu', NATIVE)
  low, high = stats.t_ci(by_hand.to_numpy())
  assert d.G.estimate == pytest.approx(by_hand.mean(), abs=1e-9)
  assert (d.G.ci_low, d.G.ci_high) == pytest.approx((low, high), abs=1e-9)
  pooled = np.mean(
    [(hand(frame, 'gpu', a) - hand(frame, 'cpu', a)).mean() for a in (NATIVE, BN16, BF16)]
  )
  assert abs(pooled - 0.4) < 0.25 and abs(d.G.estimate - 1.2) < 0.3  # the two estimands differ
  assert d.G.ci_low > 0.5


def test_per_seed_identity_holds_exactly():
  frame = planted(
    {('gpu', NATIVE): 0.9, ('gpu', EMU_GPU): 0.5, ('cpu', EMU_GPU): 0.3, ('cpu', F32): -0.2}
  )
  cells = attribution.cell_means(
    frame.assign(value=100 * frame[METRIC], **{f: frame[c].astype(str) for f, c in COL.items()}),
    'profile',
    ['batchnorm_group', 'compute_dtype'],
    REFERENCE,
  )
  summary = attribution.components(cells, 'gpu', 'cpu', 'native', EMULATES)
  v = summary.values
  assert not summary.missing and len(summary.seeds) == 12
  np.testing.assert_allclose(v['G'], v['fid_A'] - v['fid_B'] + v['N'] + v['P'], atol=1e-9)
  np.testing.assert_allclose(v['R'], v['G'] - v['N'], atol=1e-9)
  np.testing.assert_allclose(v['N_interaction'], v['N_A'] - v['N_B'], atol=1e-9)
  by_hand = (
    hand(frame, 'gpu', EMU_GPU)
    - hand(frame, 'gpu', F32)
    + hand(frame, 'cpu', EMU_GPU)
    - hand(frame, 'cpu', F32)
  ) / 2
  np.testing.assert_allclose(v['N'], by_hand.to_numpy(), atol=1e-9)


def test_a_gap_beyond_the_margin_numerics_explain_a_quarter_of_is_neither_no_gap_nor_explained():
  """Native gap +2.5 pp at ±2 pp, numerics 0.6 pp of it: the old rule (the absolute margin on the
  residual) could call it explained; the pooled estimand called it 'no gap'."""
  shift = {('gpu', NATIVE): 2.5, ('gpu', EMU_GPU): 0.6, ('cpu', EMU_GPU): 0.6}
  _, d = run(planted(shift, seeds=16), margin=2.0)
  assert d.verdict not in ('no gap', 'explained by numerics', 'gap within margin')
  assert d.flags.gap_shown and d.share_ci_low < d.min_share
  assert d.verdict == 'partly explained' and 'share' in d.open


def test_a_shown_gap_inside_the_margin_is_labelled_so():
  _, d = run(planted({('gpu', NATIVE): 0.6}, seeds=30), margin=2.0)
  assert d.flags.gap_shown and d.flags.gap_equivalent and d.verdict == 'gap within margin'
  assert 'a real gap, smaller than the margin' in report.why(d, 'pp')


@pytest.mark.parametrize(
  'shift, verdict',
  [
    ({('gpu', NATIVE): 1.5, ('gpu', EMU_GPU): 1.5, ('cpu', EMU_GPU): 1.5}, 'explained by numerics'),
    ({('gpu', NATIVE): 2.0, ('gpu', EMU_GPU): 1.0, ('cpu', EMU_GPU): 1.0}, 'partly explained'),
    ({('gpu', NATIVE): 1.5}, 'not explained'),
    ({}, 'no gap'),
  ],
)
def test_each_planted_gap_gets_its_verdict(shift, verdict):
  out, d = run(planted(shift, seeds=16), margin=0.5 if verdict != 'no gap' else 2.0)
  assert d.verdict == verdict, report.why(d, 'pp')
  assert f'**gpu − cpu: {verdict}**' in report.attribution_report(out)


def test_verdict_rules():
  f = attribution.Flags(*[False] * len(attribution.Flags._fields))
  assert attribution.verdict(f, 2)[0] == 'inconclusive'
  assert attribution.verdict(f._replace(gap_equivalent=True), 2) == ('no gap', '')
  shown = f._replace(gap_shown=True)
  assert attribution.verdict(shown._replace(gap_equivalent=True), 2)[0] == 'gap within margin'
  explained = shown._replace(numerics_shown=True, share_reaches=True, residual_equivalent=True)
  assert attribution.verdict(explained, 2)[0] == 'explained by numerics'
  assert attribution.verdict(explained._replace(share_reaches=False), 2) == (
    'partly explained',
    "the share's lower bound is below the minimum",
  )
  assert attribution.verdict(shown._replace(residual_shown=True), 2)[0] == 'not explained'
  assert attribution.verdict(shown, 2, n_estimable=False)[0] == 'inconclusive'


def test_heteroscedastic_arms_do_not_enter_the_gap_and_its_interval_covers():
  """BN/16 arms five times as noisy and shifted by platform: the gap ignores them; with a noisy
  native GPU arm (sd 1.5 vs 0.3) the per-seed t-interval still covers the planted gap."""
  noisy = {('gpu', BN16): 1.5, ('cpu', BN16): 1.5}
  _, quiet = run(planted({('gpu', NATIVE): 1.0}, noisy, rng=3))
  _, shifted = run(planted({('gpu', NATIVE): 1.0, ('gpu', BN16): 3.0}, noisy, rng=3))
  assert quiet.G.estimate == pytest.approx(shifted.G.estimate, abs=1e-9)
  rng = np.random.default_rng(7)
  n, covered = 12, 0
  for _ in range(2000):
    seed = rng.normal(0, 0.8, n)
    g = (seed + 1.0 + rng.normal(0, 1.5, n)) - (seed + rng.normal(0, 0.3, n))
    low, high = stats.t_ci(g)
    covered += low <= 1.0 <= high
  assert covered / 2000 >= 0.93


def coverage(ratio_se, share=1.0, sims=3000, n=16, rng=0):
  """(Fieller, delta method) coverage of the true share among the simulated studies whose gap is
  shown (where the share is reported), per-seed (N, G) bivariate normal with the shipped data's
  per-seed sds and correlation (G 0.91 pp, N 0.53 pp, r 0.37) and E[G] / se(G) = ratio_se."""
  rng = np.random.default_rng(rng)
  sd_g, sd_n, r = 0.91, 0.53, 0.37
  cov = [[sd_n**2, r * sd_n * sd_g], [r * sd_n * sd_g, sd_g**2]]
  g_true = ratio_se * sd_g / np.sqrt(n)
  fieller = delta = shown = 0
  for _ in range(sims):
    num, g = rng.multivariate_normal([share * g_true, g_true], cov, n).T
    _, low, high = stats.fieller(num, g)
    if np.isfinite(low):
      shown += 1
      fieller += low <= share <= high
      _, low, high = delta_ratio(num, g)
      delta += low <= share <= high
  return fieller / shown, delta / shown


def test_share_interval_covers_at_the_shipped_regime_and_beyond():
  """Fieller covers >= 93% at G/se = 2.5 (the shipped data's regime; 96% here) and at 15; the
  delta method (the nearest wrong version, which the analysis used before) under-covers at 2.5
  (89% here)."""
  fieller, delta = coverage(2.5)
  assert fieller >= 0.93 and delta < fieller - 0.03, (fieller, delta)
  fieller, _ = coverage(15.0, share=0.5, sims=1000)
  assert fieller >= 0.93


def test_share_is_fieller_and_unbounded_when_the_gap_is_not_shown():
  _, d = run(
    planted({('gpu', NATIVE): 2.0, ('gpu', EMU_GPU): 1.0, ('cpu', EMU_GPU): 1.0}, seeds=16)
  )
  assert d.share == pytest.approx(d.N.estimate / d.G.estimate)
  assert d.share_ci_low < d.share < d.share_ci_high and 'Fieller' in d.share_method
  _, none = run(planted({}, seeds=16))
  assert not none.flags.gap_shown and none.share_ci_low == -np.inf


def test_a_missing_emulation_names_the_component_it_cannot_estimate():
  frame = planted({('gpu', NATIVE): 1.0})
  frame = frame[~((frame['platform'] == 'cpu') & (frame[COL['profile']] == 'jax_gpu_default'))]
  out, d = run(frame)
  assert 'jax_gpu_default on cpu' in d.missing['N_B'] and 'P_eA' in d.missing
  assert d.N_estimable  # from the GPU alone, and labelled so
  assert 'one platform only' in d.N_label
  assert 'not estimable: no runs of jax_gpu_default on cpu' in report.attribution_report(out)


def test_decomposition_csv_columns(tmp_path):
  out, _ = run(planted({('gpu', NATIVE): 1.0}))
  analyse.write_csv(attribution.tables(out), str(tmp_path))
  table = pd.read_csv(tmp_path / 'attribution_decomposition.csv')
  for col in (
    'G',
    'G_ci_low',
    'G_ci_high',
    'N',
    'R',
    'share',
    'share_ci_low',
    'share_ci_high',
    'verdict',
    'fid_A',
    'fid_B',
    'N_A',
    'N_B',
    'N_interaction',
    'P',
    'P_eA',
    'P_eB',
    'open',
    'G_signed_rank_p',
    'G_d_z',
    'G_mixed_model',
    'platform_a',
    'platform_b',
    'seeds_used',
  ):
    assert col in table, col
  components = pd.read_csv(tmp_path / 'attribution_gap.csv')
  assert list(components['key']) == list(attribution.KEYS)


def test_the_shipped_export_gap_is_the_native_arms_paired_mean():
  """results/: G = gpu native − cpu native, f32 activations, global BatchNorm, paired by seed
  (+0.26 pp [−0.22, +0.75]), computed here by hand from the raw CSV."""
  frame = pd.read_csv('results/digits_h100_cpu.csv')
  native = frame[
    (frame['config.numerics.profile'] == 'native')
    & (frame['config.numerics.batchnorm_group'] == 0)
    & (frame['config.numerics.compute_dtype'] == 'float32')
  ]
  by_seed = native.pivot_table(index='seed', columns='platform', values=METRIC) * 100
  d_hand = (by_seed['gpu'] - by_seed['cpu']).to_numpy()
  out = attribution.factor_attribution(
    frame,
    FACTORS,
    reference=REFERENCE,
    margin=2.0,
    native={'profile': 'native'},
    platform_profile=EMULATES,
  )
  (d,) = out.decomposition
  assert d.G.estimate == pytest.approx(d_hand.mean(), abs=1e-9) and round(d.G.estimate, 2) == 0.26
  assert (round(d.G.ci_low, 2), round(d.G.ci_high, 2)) == (-0.22, 0.75)
  assert d.verdict == 'no gap'
