"""What the platform gap's decomposition (analysis/numbers/gap.py) shows: flags, a verdict that
cannot claim more than its intervals, the share explained and the seeds a decisive answer needs.

alpha = 0.05. k = the platform pairs compared (the declaration's compare, --compare, or every pair).
Each pair's three tests of its gap G are Holm-adjusted over the k pairs (judge_family): the
paired-t p (G_p_holm), the TOST p against +-m (G_tost_p_holm) and the exact signed-rank p
(G_signed_rank_p_holm). With one pair these are the raw p-values, and "shown" reads as the 95%
t-interval over seeds excluding 0, "within the margin" as the 90% interval inside +-m (TOST;
Schuirmann 1987). The split of a pair's gap (N, R, the share) is judged at alpha within the pair: a
pair's "explained" claim is an intersection-union test (Berger 1982), level alpha.
m = the margin, s0 = the declared minimum share (get_study()['min_share'], default MIN_SHARE):
  tests disagree         the paired t-test and the exact signed-rank test disagree on whether G is
                         0: one rejects 0 and the other, which could (its smallest attainable p,
                         every seed of one sign, is below alpha / k), does not (one heavy-tailed
                         seed moves the mean but not the ranks, or the reverse); `open` says which,
                         and whether G lies within +-m. Never "no gap" beside a rank p < alpha;
  no gap                 G is not shown and lies within +-m;
  gap within margin      G is shown but lies within +-m: real and small;
  explained by numerics  G is shown and not within +-m, N is shown with G's sign, the share's
                         lower 95% bound (Fieller) is at least s0, R lies within +-m, and N was
                         measured on both platforms;
  partly explained       G is shown, N is shown with G's sign, but the share's lower bound is
                         below s0, R is not within +-m, or N rests on one platform only (its
                         interaction with the platform untested); `open` says which;
  not explained          G is shown, N is not shown with G's sign, and R is shown;
  inconclusive           anything else; `open` names the part that is open.
The margin is absolute (the metric's units) and so applies to G and R; how much of G the numerics
account for is judged by the share, which is relative to G.

Seeds needed (seeds_needed): paired t, alpha 0.05, 80% power, at each component's observed per-seed
sd, for effects worth powering: a true G (or N) of the margin's size, the smallest effect the
study declares of interest; G (or R) within +-m when it is truly 0. Without a margin nothing is
powered (there is no effect of interest), and the report says so.
Reference: docs/statistics.md "The gap decomposition".
"""

import numpy as np
import pandas as pd

from analysis import declaration, stats

VERDICTS = (
  'no gap',
  'gap within margin',
  'explained by numerics',
  'partly explained',
  'not explained',
  'tests disagree',
  'inconclusive',
)
MIN_SHARE = declaration.MIN_SHARE
MIN_SHARE_REASON = (
  'default: the numerics part must be at least half of the gap by the lower 95% '
  'bound of the share, so that it is the larger part at 95% confidence'
)
KEYS = ('G', 'fid_A', 'fid_B', 'N_A', 'N_B', 'N', 'N_interaction', 'P_eA', 'P_eB', 'P', 'R')
HOLM = ('G_p', 'G_tost_p', 'G_signed_rank_p')  # the gap's tests, adjusted over the pairs


def shown(low, high):
  """+1 when a 95% CI lies above 0, -1 below, 0 when it includes 0 (or is NaN)."""
  return 1 if low > 0 else -1 if high < 0 else 0


def rank_flags(d):
  """(t shows G, the signed-rank test shows G, the rank test could show it at these seeds)."""
  k = d['pairs_compared']
  return (
    bool(d['G_p_holm'] < stats.ALPHA),
    bool(d['G_signed_rank_p_holm'] < stats.ALPHA),
    bool(d['G_signed_rank_attainable'] * k < stats.ALPHA),
  )


def flags(d):
  """The verdict's inputs from judge()'s numbers (after judge_family's Holm columns)."""
  t_shows, rank_shows, rank_can = rank_flags(d)
  sign = int(np.sign(d['G'])) if t_shows else 0
  n_sign = shown(d['N_ci_low'], d['N_ci_high']) if d['N_estimable'] else 0
  return {
    'gap_shown': t_shows,
    'gap_equivalent': bool(d['G_tost_p_holm'] < stats.ALPHA),
    'rank_shown': rank_shows,
    'tests_disagree': rank_shows != t_shows and (rank_shows or rank_can),
    'numerics_shown': bool(sign) and n_sign == sign,
    'numerics_opposite': bool(sign) and n_sign == -sign,
    'numerics_one_platform': bool(d['N_only']),
    'interaction_shown': bool(shown(d['N_interaction_ci_low'], d['N_interaction_ci_high'])),
    'share_reaches': bool(d['share_ci_low'] >= d['min_share']),
    'residual_equivalent': bool(d['R_tost_p'] < stats.ALPHA),
    'residual_shown': bool(d['N_estimable'] and shown(d['R_ci_low'], d['R_ci_high'])),
  }


def disagreement(f, m):
  """The open part of 'tests disagree': which test shows the gap, and the margin."""
  which = (
    'the signed-rank test rejects 0, the t-interval does not (a seed far from the others widens it)'
    if f['rank_shown']
    else 'the t-interval excludes 0, the signed-rank test does not (the mean rests on a few seeds)'
  )
  within = f'; within {m} by TOST' if f['gap_equivalent'] else f'; not shown within {m}'
  return which + within


def verdict(f, margin, n_estimable=True):
  """(verdict, open part) from flags() (module doc)."""
  m = f'±{margin:g}' if margin else 'a margin (none given)'
  if f.get('tests_disagree'):
    return 'tests disagree', disagreement(f, m)
  if not f['gap_shown']:
    return (
      ('no gap', '')
      if f['gap_equivalent']
      else ('inconclusive', f'the gap: neither shown nor within {m}')
    )
  if f['gap_equivalent']:
    return 'gap within margin', ''
  if not n_estimable:
    return 'inconclusive', 'the numerics part: not estimable from the arms run'
  if f['numerics_shown']:
    why = [
      w
      for ok, w in (
        (f['share_reaches'], "the share's lower bound is below the minimum"),
        (f['residual_equivalent'], f'the residual is not within {m}'),
        (not f.get('numerics_one_platform'), 'the numerics part is measured on one platform only'),
      )
      if not ok
    ]
    return ('explained by numerics', '') if not why else ('partly explained', '; '.join(why))
  if f['residual_shown']:
    return 'not explained', ''
  return (
    'inconclusive',
    f'the numerics part (not shown) and the residual (not shown, not within {m})',
  )


def seeds_needed(table, margin):
  """{question: seeds} for 80% power (paired t, alpha 0.05) at the observed per-seed sds, each at
  the margin (module doc); {} without a margin."""
  if not margin:
    return {}
  row = {r['key']: r for _, r in table.iterrows() if r['note'] == ''}

  def need(key, which):
    return stats.seeds_needed(row[key]['sd'], margin, True)[which]

  out = {'gap nonzero': need('G', 0)}
  if 'N' in row:
    out['numerics part nonzero'] = need('N', 0)
  out['gap within margin'] = need('G', 1)
  if 'R' in row:
    out['residual within margin'] = need('R', 1)
  return out


def judge(summary, table, margin, min_share=None):
  """One gap's numbers (per component key: estimate, se, CI, p; G and R with their TOST; G with
  its signed-rank p, its smallest attainable signed-rank p and d_z), the share, the seeds used;
  flags and verdict come from judge_family."""
  rows = table[table['gap'] == summary['gap']].set_index('key')
  s0 = MIN_SHARE if min_share is None else min_share
  d = {
    'gap': summary['gap'],
    'platforms': summary['platforms'],
    'profiles': summary['profiles'],
    'margin': margin,
    'min_share': s0,
    'seeds': len(summary['seeds']),
    'seed_list': list(summary['seeds']),
    'missing': dict(summary['missing']),
    'N_estimable': 'N' in summary['values'],
    'cross_check': summary['cross_check'],
    'N_label': summary['labels']['N'],
    'N_only': summary.get('n_only'),
  }
  for key in KEYS:
    r = rows.loc[key] if key in rows.index else None
    ok = r is not None and r['note'] == ''
    for field, col in (
      ('', 'estimate'),
      ('_se', 'se'),
      ('_ci_low', 'ci_low'),
      ('_ci_high', 'ci_high'),
      ('_p', 'p'),
    ):
      d[key + field] = float(r[col]) if ok else np.nan
  for key in ('G', 'R'):
    ok = key in rows.index and rows.loc[key, 'note'] == ''
    for field in ('ci90_low', 'ci90_high', 'tost_p'):
      d[f'{key}_{field}'] = float(rows.loc[key, field]) if ok else np.nan
  g = np.asarray(summary['values']['G'], float)
  d['G_signed_rank_p'] = float(rows.loc['G', 'signed_rank_p'])
  d['G_signed_rank_method'] = rows.loc['G', 'signed_rank_method']
  d['G_signed_rank_attainable'] = stats.signed_rank(np.abs(g))[1]
  d['G_seeds_positive'], d['G_seeds_negative'] = int((g > 0).sum()), int((g < 0).sum())
  d['G_d_z'] = float(rows.loc['G', 'd_z'])
  d['share'], d['share_ci_low'], d['share_ci_high'] = (
    stats.fieller(summary['values']['N'], summary['values']['G'])
    if d['N_estimable']
    else (np.nan,) * 3
  )
  d['share_method'] = "Fieller's interval over seeds"
  d['seeds_needed'] = seeds_needed(table[table['gap'] == summary['gap']], margin)
  return d


def decide(d):
  """d with its flags, verdict and open part (after its Holm columns are set)."""
  f = flags(d)
  d.update(f)
  d['verdict'], d['open'] = verdict(f, d['margin'], d['N_estimable'])
  return d


def judge_family(summaries, tables, margin, min_share=None):
  """[judge dict per pair] with `pairs_compared` (k) and each HOLM p-value Holm-adjusted over the
  k pairs (`<test>_holm`; stats.holm), then flags and verdict (decide)."""
  judged = [judge(s, t, margin, min_share) for s, t in zip(summaries, tables, strict=True)]
  for key in HOLM:
    adjusted = stats.holm([d[key] for d in judged])
    for d, p in zip(judged, adjusted, strict=True):
      d[f'{key}_holm'] = float(p)
  for d in judged:
    d['pairs_compared'] = len(judged)
  return [decide(d) for d in judged]


def flat(decomposition):
  """One row per platform pair: platform_a, platform_b (G = a − b), profile_a, profile_b, every
  number, flag and the verdict (the CSV attribution_decomposition.csv), the mixed-model
  cross-check, one `seeds_for_<question>` column per question."""
  skip = ('seeds_needed', 'profiles', 'platforms', 'seed_list', 'missing', 'cross_check')
  rows = []
  for d in decomposition:
    row = {
      'platform_a': d['platforms'][0],
      'platform_b': d['platforms'][1],
      **{k: v for k, v in d.items() if k not in skip},
      'profile_a': d['profiles'][0],
      'profile_b': d['profiles'][1],
      'seeds_used': ' '.join(map(str, d['seed_list'])),
      'not_estimable': '; '.join(f'{k}: {v}' for k, v in d['missing'].items()),
    }
    for key in ('G', 'N', 'R'):
      c = d['cross_check'].get(key) or {}
      row[f'{key}_mixed_model'] = c.get('estimate', np.nan)
      row[f'{key}_mixed_model_ci_low'] = c.get('ci_low', np.nan)
      row[f'{key}_mixed_model_ci_high'] = c.get('ci_high', np.nan)
      row[f'{key}_mixed_model_note'] = c.get('note', '')
    row.update({f'seeds_for_{q.replace(" ", "_")}': n for q, n in d['seeds_needed'].items()})
    rows.append(row)
  return pd.DataFrame(rows)
