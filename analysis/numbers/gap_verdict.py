"""What the platform gap's decomposition (analysis/numbers/gap.py) shows: flags, a verdict that
cannot claim more than its intervals, the share explained and the seeds a decisive answer needs.

alpha = 0.05; "shown" = the 95% t-interval over seeds excludes 0; "within the margin" = TOST
p < alpha against +-margin (the 90% CI inside +-margin; Schuirmann 1987). m = the margin, s0 = the
declared minimum share (get_study()['min_share'], default MIN_SHARE):
  no gap                 G is not shown and lies within +-m;
  gap within margin      G is shown (its 95% CI excludes 0) but lies within +-m: real and small;
  explained by numerics  G is shown and not within +-m, N is shown with G's sign, the share's
                         lower 95% bound (Fieller) is at least s0, and R lies within +-m;
  partly explained       G is shown, N is shown with G's sign, but the share's lower bound is
                         below s0 or R is not within +-m (the `open` text says which);
  not explained          G is shown, N is not shown with G's sign, and R is shown;
  inconclusive           anything else; `open` names the part that is open.
"Explained by numerics" is an intersection-union test (Berger 1982): every part at alpha gives the
whole claim level alpha. The margin is absolute (the metric's units) and so applies to G and R;
how much of G the numerics account for is judged by the share, which is relative to G.
"""

import numpy as np
import pandas as pd

from analysis.inputs import declaration
from analysis.numbers import inference

VERDICTS = ('no gap', 'gap within margin', 'explained by numerics', 'partly explained',
            'not explained', 'inconclusive')
MIN_SHARE = declaration.MIN_SHARE
MIN_SHARE_REASON = ('default: the numerics part must be at least half of the gap by the lower 95% '
                    'bound of the share, so that it is the larger part at 95% confidence')
KEYS = ('G', 'fid_A', 'fid_B', 'N_A', 'N_B', 'N', 'N_interaction', 'P_eA', 'P_eB', 'P', 'R')


def shown(low, high):
  """+1 when a 95% CI lies above 0, -1 below, 0 when it includes 0 (or is NaN)."""
  return 1 if low > 0 else -1 if high < 0 else 0


def flags(d):
  """The verdict's inputs from judge()'s numbers."""
  sign = shown(d['G_ci_low'], d['G_ci_high'])
  n_sign = shown(d['N_ci_low'], d['N_ci_high']) if d['N_estimable'] else 0
  return {'gap_shown': bool(sign), 'gap_equivalent': bool(d['G_tost_p'] < inference.ALPHA),
          'numerics_shown': bool(sign) and n_sign == sign,
          'numerics_opposite': bool(sign) and n_sign == -sign,
          'share_reaches': bool(d['share_ci_low'] >= d['min_share']),
          'residual_equivalent': bool(d['R_tost_p'] < inference.ALPHA),
          'residual_shown': bool(d['N_estimable'] and shown(d['R_ci_low'], d['R_ci_high']))}


def verdict(f, margin, n_estimable=True):
  """(verdict, open part) from flags() (module doc)."""
  m = f'±{margin:g}' if margin else 'a margin (none given)'
  if not f['gap_shown']:
    return ('no gap', '') if f['gap_equivalent'] else (
        'inconclusive', f'the gap: neither shown nor within {m}')
  if f['gap_equivalent']:
    return 'gap within margin', ''
  if not n_estimable:
    return 'inconclusive', 'the numerics part: not estimable from the arms run'
  if f['numerics_shown']:
    if f['share_reaches'] and f['residual_equivalent']:
      return 'explained by numerics', ''
    why = [w for ok, w in ((f['share_reaches'], "the share's lower bound is below the minimum"),
                           (f['residual_equivalent'], f'the residual is not within {m}')) if not ok]
    return 'partly explained', '; '.join(why)
  if f['residual_shown']:
    return 'not explained', ''
  return 'inconclusive', f'the numerics part (not shown) and the residual (not shown, not within {m})'


def seeds_needed(table, margin):
  """{question: seeds} for 80% power (paired t, alpha 0.05) at the observed per-seed sds."""
  row = {r['key']: r for _, r in table.iterrows() if r['note'] == ''}
  need = lambda key, effect, which: inference.seeds_needed(row[key]['sd'], effect, True)[which]
  out = {'gap nonzero': need('G', abs(row['G']['estimate']), 0)}
  if 'N' in row:
    out['numerics part nonzero'] = need('N', abs(row['N']['estimate']), 0)
  if margin:
    out['gap within margin'] = need('G', margin, 1)
    if 'R' in row:
      out['residual within margin'] = need('R', margin, 1)
  return out


def judge(summary, table, margin, min_share=None):
  """One gap's numbers (per component key: estimate, se, CI, p; G and R with their TOST; G with
  its signed-rank p and d_z), the share, the flags, the verdict and its open part."""
  rows = table[table['gap'] == summary['gap']].set_index('key')
  s0 = MIN_SHARE if min_share is None else min_share
  d = {'gap': summary['gap'], 'platforms': summary['platforms'], 'profiles': summary['profiles'],
       'margin': margin, 'min_share': s0, 'seeds': len(summary['seeds']),
       'seed_list': list(summary['seeds']), 'missing': dict(summary['missing']),
       'N_estimable': 'N' in summary['values'], 'cross_check': summary['cross_check'],
       'N_label': summary['labels']['N']}
  for key in KEYS:
    r = rows.loc[key] if key in rows.index else None
    ok = r is not None and r['note'] == ''
    for field, col in (('', 'estimate'), ('_se', 'se'), ('_ci_low', 'ci_low'),
                       ('_ci_high', 'ci_high'), ('_p', 'p')):
      d[key + field] = float(r[col]) if ok else np.nan
  for key in ('G', 'R'):
    ok = key in rows.index and rows.loc[key, 'note'] == ''
    for field in ('ci90_low', 'ci90_high', 'tost_p'):
      d[f'{key}_{field}'] = float(rows.loc[key, field]) if ok else np.nan
  d['G_signed_rank_p'] = float(rows.loc['G', 'signed_rank_p'])
  d['G_signed_rank_method'] = rows.loc['G', 'signed_rank_method']
  d['G_d_z'] = float(rows.loc['G', 'd_z'])
  d['share'], d['share_ci_low'], d['share_ci_high'] = (
      inference.fieller(summary['values']['N'], summary['values']['G'])
      if d['N_estimable'] else (np.nan,) * 3)
  d['share_method'] = "Fieller's interval over seeds"
  f = flags(d)
  d.update(f)
  d['verdict'], d['open'] = verdict(f, margin, d['N_estimable'])
  d['seeds_needed'] = seeds_needed(table[table['gap'] == summary['gap']], margin)
  return d


def flat(decomposition):
  """One row per gap: every number, flag and the verdict (the CSV attribution_decomposition.csv),
  one `seeds_for_<question>` column per question; platform_A/B and profile_A/B name the parts."""
  skip = ('seeds_needed', 'profiles', 'platforms', 'seed_list', 'missing', 'cross_check')
  rows = []
  for d in decomposition:
    row = {k: v for k, v in d.items() if k not in skip}
    row.update(platform_A=d['platforms'][0], platform_B=d['platforms'][1],
               profile_A=d['profiles'][0], profile_B=d['profiles'][1],
               seeds_used=' '.join(map(str, d['seed_list'])),
               not_estimable='; '.join(f'{k}: {v}' for k, v in d['missing'].items()))
    for key in ('G', 'N', 'R'):
      c = d['cross_check'].get(key)
      row[f'{key}_mixed_model'] = c['estimate'] if c else np.nan
      row[f'{key}_mixed_model_ci_low'] = c['ci_low'] if c else np.nan
      row[f'{key}_mixed_model_ci_high'] = c['ci_high'] if c else np.nan
    row.update({f'seeds_for_{q.replace(" ", "_")}': n for q, n in d['seeds_needed'].items()})
    rows.append(row)
  return pd.DataFrame(rows)
