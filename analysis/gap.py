"""The platform gap of analysis.attribution: its split into a numerics part and a platform residual,
and a verdict that says what the split shows.

The `native` arm runs each platform's own default arithmetic; the emulated profiles (tpu_default,
jax_gpu_default, ...) reproduce one platform's arithmetic on every platform. The gap model crosses
the arithmetic factor with platform (one coefficient per observed (platform, profile) cell; the
other factors additive). For a platform A and the reference platform B:
  native gap  G = native arm on A - native arm on B (adjusted for seed and the other factors);
  numerics    N = cell(profile emulating A) - cell(profile emulating B), averaged over the
                  platforms that ran both, plus, for each other factor whose level differs between
                  the two native arms, its coefficient difference (one row per factor);
  residual    R = G - N: what the emulated arithmetic does not reproduce.
Each is a linear contrast c'b of the coefficients with standard error sqrt(c'Vc) from the fit's
covariance V (mixed or cluster-robust), so the correlation of G, N and R (shared runs) is kept.

Verdict (alpha = 0.05; "shown" = the 95% CI excludes 0; "equivalent" = TOST p < alpha against
+-margin, Schuirmann 1987, i.e. the 90% CI inside +-margin):
  no gap                 G is equivalent to 0: there is nothing beyond the margin to explain;
  explained by numerics  G is shown, N is shown with G's sign, and R is equivalent to 0;
  partly explained       G is shown, N is shown with G's sign, and R is shown too;
  not explained          G is shown, R is shown, and N is not shown with G's sign;
  inconclusive           anything else (the flags say which part is open).
"Explained by numerics" is an intersection-union test (Berger 1982): each part at alpha gives the
whole claim level alpha, with no multiplicity correction among its parts.

Share explained: s = N / G with a delta-method interval, se(s) = se(N - s G) / |G| (the contrast
N - sG evaluated at the estimate s, so cov(N, G) is included), t (or normal) quantile with the
fit's df; reported only when G is shown. Seeds for a decisive answer: analysis.inference's
seeds_needed (paired t power, 80%, alpha 0.05) with the per-seed sd of each contrast, se x
sqrt(seeds): to show G and N nonzero at their estimates, and G or R within +-margin when the true
value is 0.
"""

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import effects, inference

CELL = 'platform x arithmetic'
VERDICTS = ('no gap', 'explained by numerics', 'partly explained', 'not explained', 'inconclusive')


def cell_weights(X, cell, sign=1.0):
  """Weights of a (platform, profile) cell's coefficient (none for the reference cell)."""
  col = f'{CELL}={cell}'
  return pd.Series({col: sign} if col in X else {}, dtype=float)


def total(weights):
  """Sum of weight Series, a missing column counting as 0."""
  out = pd.Series(dtype=float)
  for w in weights:
    out = out.add(w, fill_value=0.0)
  return out


def gap_weights(X, runs, a, b, native, emu, others):
  """(gap weights, [(numerics part name, weights)]) of platform a's native gap against b."""
  nf, nl = native
  nat = lambda p: (runs['platform'] == p) & (runs[nf] == nl)
  gap = X[nat(a)].mean() - X[nat(b)].mean()
  cells = set(runs[CELL])
  both = [p for p in sorted(set(runs['platform'])) if {f'{p}|{emu[a]}', f'{p}|{emu[b]}'} <= cells]
  if not both:
    raise LookupError(f'no platform ran both {nf}={emu[a]} and {nf}={emu[b]}')
  num = total(w for p in both for w in (cell_weights(X, f'{p}|{emu[a]}'),
                                        cell_weights(X, f'{p}|{emu[b]}', -1.0))) / len(both)
  parts = [(f'numerics: {nf} {emu[a]} - {emu[b]} (on {", ".join(both)})', num)]
  for f in others:
    w = gap[[c for c in X if c.startswith(f'{f}=')]]
    if w.abs().sum() > 1e-12:
      parts.append((f'numerics: {f} as in the native arms', w))
  return gap, parts


def gap_rows(model, X, runs, a, b, native, emu, others):
  """(component rows, summary) of platform a's native gap against b: rows `gap`, `component`,
  `kind` (gap | numerics | numerics total | residual) and the contrast's numbers; the summary is
  judge()'s input (the contrasts G, N, R and the weights the share needs)."""
  gap, parts = gap_weights(X, runs, a, b, native, emu, others)
  num = total(w for _, w in parts)
  label = f'{a} - {b}'
  named = [('native gap', 'gap', gap)] + [(name, 'numerics', w) for name, w in parts]
  if len(parts) > 1:
    named.append(('numerics part (sum)', 'numerics total', num))
  named.append(('platform residual', 'residual', total([gap, -num])))
  rows = [{'gap': label, 'component': name, 'kind': kind, **effects.contrast(model, w)}
          for name, kind, w in named]
  part = lambda kind: next(r for r in rows if r['kind'] == kind)
  numerics = part('numerics total') if len(parts) > 1 else part('numerics')
  return rows, {'gap': label, 'G': part('gap'), 'N': numerics, 'R': part('residual'),
                'weights': (gap, num), 'profiles': (emu[a], emu[b])}


def default_emulation(runs, native_factor, platforms, given):
  """{platform: profile level emulating its native arithmetic}: given, else <p>_default or
  jax_<p>_default when that level exists."""
  lv = set(runs[native_factor])
  out = {}
  for p in platforms:
    guess = [c for c in (f'{p}_default', f'jax_{p}_default') if c in lv]
    out[p] = given.get(p, guess[0] if guess else None)
    if out[p] is None:
      raise LookupError(f'no level of {native_factor} emulates {p}; give --platform-profile {p}=LEVEL')
    if out[p] not in lv:
      raise ValueError(f'--platform-profile: {native_factor} has no level {out[p]!r}; '
                       f'levels: {", ".join(sorted(lv))}')
  return out


def native_arm(runs, columns, given):
  """(factor, level) of the native arm: --native, else a 'profile' factor with a 'native' level."""
  if given:
    (name, level), = given.items() if len(given) == 1 else [(None, None)]
    if name is None:
      raise ValueError('--native: give one factor=level, e.g. --native profile=native')
    factor = effects.find_factor(name, columns, '--native')
    if level not in set(runs[factor]):
      raise ValueError(f'--native: {factor} has no level {level!r}; levels: '
                       f'{", ".join(effects.levels(runs, factor))}')
    return factor, level
  for factor, col in columns.items():
    if col.rsplit('.', 1)[-1] == 'profile' and 'native' in set(runs[factor]):
      return factor, 'native'
  return None


def shown(c):
  """Does the contrast's 95% CI exclude 0? (+1 above, -1 below, 0 no)."""
  return 1 if c['ci_low'] > 0 else -1 if c['ci_high'] < 0 else 0


def equivalence(c, margin):
  """(90% CI low, high, TOST p) of contrast c against +-margin; NaNs without a margin."""
  if not margin:
    return np.nan, np.nan, np.nan
  return inference.tost(c['estimate'], c['se'], c['df'], margin)


def share(model, summary):
  """(s = N / G, its 95% CI low, high) by the delta method (module doc); NaNs when G is not shown."""
  G, N = summary['G'], summary['N']
  if not shown(G):
    return np.nan, np.nan, np.nan
  s = N['estimate'] / G['estimate']
  gap, num = summary['weights']
  se = effects.contrast(model, total([num, -s * gap]))['se'] / abs(G['estimate'])
  half = sps.t.ppf(0.975, G['df']) * se
  return s, s - half, s + half


def seeds_needed(summary, seeds, margin):
  """{question: seeds} for a decisive answer at the observed per-seed sds (module doc)."""
  sd = lambda c: c['se'] * np.sqrt(seeds)
  G, N, R = summary['G'], summary['N'], summary['R']
  out = {'gap nonzero': inference.seeds_needed(sd(G), abs(G['estimate']), True)[0],
         'numerics part nonzero': inference.seeds_needed(sd(N), abs(N['estimate']), True)[0]}
  if margin:
    out['gap within margin'] = inference.seeds_needed(sd(G), margin, True)[1]
    out['residual within margin'] = inference.seeds_needed(sd(R), margin, True)[1]
  return out


def verdict(flags):
  """The verdict (VERDICTS) from judge()'s flags (module doc)."""
  if flags['gap_equivalent']:
    return 'no gap'
  if not flags['gap_shown']:
    return 'inconclusive'
  if flags['numerics_shown'] and flags['residual_equivalent']:
    return 'explained by numerics'
  if flags['numerics_shown'] and flags['residual_shown']:
    return 'partly explained'
  if flags['residual_shown']:
    return 'not explained'
  return 'inconclusive'


def judge(summary, margin):
  """The decomposition's numbers and verdict at `margin` (None: no equivalence test): a dict with
  the G, N, R estimates and CIs, their TOST (90% CI, p), the flags and the verdict."""
  G, N, R = summary['G'], summary['N'], summary['R']
  sign = shown(G)
  g90, r90 = equivalence(G, margin), equivalence(R, margin)
  flags = {'gap_equivalent': bool(g90[2] < inference.ALPHA), 'gap_shown': bool(sign),
           'numerics_shown': bool(sign) and shown(N) == sign,
           'numerics_opposite': bool(sign) and shown(N) == -sign,
           'residual_equivalent': bool(r90[2] < inference.ALPHA), 'residual_shown': bool(shown(R))}
  out = {'gap': summary['gap'], 'margin': margin, 'profiles': summary['profiles']}
  for key, c in (('G', G), ('N', N), ('R', R)):
    out.update({f'{key}': c['estimate'], f'{key}_se': c['se'], f'{key}_ci_low': c['ci_low'],
                f'{key}_ci_high': c['ci_high'], f'{key}_p': c['p']})
  out.update({'G_ci90_low': g90[0], 'G_ci90_high': g90[1], 'G_tost_p': g90[2],
              'R_ci90_low': r90[0], 'R_ci90_high': r90[1], 'R_tost_p': r90[2]})
  return {**out, **flags, 'verdict': verdict(flags)}


def decompose(runs, y, seeds, columns, ref, native, given_map):
  """(component table, [summary per gap], gap model, emulation map) of each platform against the
  reference platform."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  order = sorted(set(runs['platform']))
  base = ref[plat] if plat else order[0]
  emu = default_emulation(runs, nf, order, given_map)
  runs = runs.assign(**{CELL: runs['platform'] + '|' + runs[nf]})
  if f'{base}|{nl}' not in set(runs[CELL]):
    raise LookupError(f'no {nf}={nl} run on the reference platform {base}')
  others = [f for f in columns if f not in (nf, plat)]
  X = effects.design(runs, [CELL] + others, {CELL: f'{base}|{nl}', **ref})
  model = effects.fit(y, X, seeds)
  rows, summaries = [], []
  for a in order:
    if a != base and f'{a}|{nl}' in set(runs[CELL]):
      more, summary = gap_rows(model, X, runs, a, base, native, emu, others)
      rows, summaries = rows + more, summaries + [summary]
  if not rows:
    raise LookupError(f'no platform other than {base} has a {nf}={nl} run')
  return pd.DataFrame(rows), summaries, model, emu


def summarise(model, summaries, seeds, margin):
  """One judge() dict per gap, with the share explained and the seeds a decisive answer needs."""
  out = []
  for summary in summaries:
    s, low, high = share(model, summary)
    out.append({**judge(summary, margin), 'share': s, 'share_ci_low': low, 'share_ci_high': high,
                'share_method': 'delta method', 'seeds': seeds,
                'seeds_needed': seeds_needed(summary, seeds, margin)})
  return out


def flat(decomposition):
  """One row per gap of summarise()'s dicts: the numbers, flags and verdict, the share, and one
  `seeds_for_<question>` column per question of seeds_needed."""
  rows = [{k: v for k, v in d.items() if k not in ('seeds_needed', 'profiles')}
          | {f'seeds_for_{q.replace(" ", "_")}': n for q, n in d['seeds_needed'].items()}
          for d in decomposition]
  return pd.DataFrame(rows)


def with_tost(table, margin):
  """The component table with the 90% CI and TOST p of the native gap and residual rows."""
  extra = [dict(zip(('ci90_low', 'ci90_high', 'tost_p'), equivalence(r, margin)))
           if r['kind'] in ('gap', 'residual') else {} for _, r in table.iterrows()]
  return pd.concat([table, pd.DataFrame(extra, index=table.index)], axis=1)


def section(runs, y, seeds, columns, ref, native, platform_profile, margin):
  """{'table', 'decomposition', 'native', 'emulation', 'method', 'model', 'summaries', 'note'}
  of the gap; table None, decomposition [] and `note` saying why when it cannot be split."""
  platforms = sorted(set(runs['platform'].astype(str))) if 'platform' in runs else []
  none = lambda note: {'table': None, 'decomposition': [], 'note': note, 'emulation': None,
                       'native': None}
  if len(platforms) < 2:
    return none(f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
                'platform gap; each arm minus the reference arm instead')
  arm = native_arm(runs, columns, effects.parse_pairs(native, '--native'))
  if arm is None:
    return none('gap decomposition unavailable: no native arm (give --native factor=level); '
                'each arm minus the reference arm instead')
  given = effects.parse_pairs(platform_profile, '--platform-profile')
  bad = set(given) - set(platforms)
  if bad:
    raise ValueError(f'--platform-profile: no runs on {", ".join(sorted(bad))}; platforms: '
                     f'{", ".join(platforms)}')
  try:
    table, summaries, model, emu = decompose(runs.assign(platform=runs['platform'].astype(str)),
                                             y, seeds, columns, ref, arm, given)
  except LookupError as e:
    return none(f'gap decomposition unavailable: {e.args[0]}; each arm minus the reference arm '
                'instead')
  n_seeds = int(seeds.nunique()) if seeds is not None else len(runs)
  return {'table': with_tost(table, margin), 'note': None, 'native': arm, 'emulation': emu,
          'method': model['method'], 'model': model, 'summaries': summaries,
          'decomposition': summarise(model, summaries, n_seeds, margin)}
