"""The platform gap of analysis.numbers.attribution, measured as it is named: per seed, from the
paired cell means of the arms that define it, split exactly into what the emulated arithmetic
explains and what it does not. Verdict words: analysis/numbers/gap_verdict.py.

Cells. y(P, e, s) = the metric of seed s on platform P under profile level e, every other declared
factor at its reference level (batchnorm_group=0, f32 activations: arms with another level, e.g.
BN/16 or bf16 activations, never enter), replicates of a seed averaged. A = a platform, B = the
reference platform; nat = the native arm, eA / eB = the profiles emulating A's / B's native
arithmetic (the declaration's platform_profile). Per seed s:
  G     = nat_A - nat_B                       the native gap (the question)
  fid_X = nat_X - eX_X                        does the profile emulating X reproduce X, on X
  N_X   = eA_X - eB_X                         the numerics part measured on platform X
  N     = (N_A + N_B) / 2                     the numerics part;  N_A - N_B its interaction
  P_e   = e_A - e_B                           the platforms under the same emulated arithmetic e
  P     = (P_eA + P_eB) / 2
  R     = G - N = fid_A - fid_B + P           what the emulated arithmetic does not reproduce
  and the identity G = fid_A - fid_B + N + P holds exactly, seed by seed.
Each component's estimate is its mean over the seeds that ran every cell it needs (the seeds of
all cells, so the identity holds on the means too), with a t-interval over those seeds (the
paired design's own: robust to unequal arm variances, no model), two-sided paired-t p and, for G,
Wilcoxon's signed-rank p and d_z. G and R also get their TOST against the margin. Share explained
s = N / G with Fieller's interval over the same seeds (analysis.numbers.inference.fieller). A component
whose cells were not run is reported as not estimable, naming the missing cells.

Cross-check (named, not the estimator): a MixedLM (random intercept per seed) over the same cells
with one coefficient per cell, the same G, N and R as contrasts (analysis/numbers/effects.py); it assumes
one residual variance for every cell.
"""

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.numbers import effects, gap_verdict, inference

KINDS = ('gap', 'fidelity', 'numerics', 'numerics total', 'numerics interaction', 'platform',
         'platform total', 'residual')


def cell_means(runs, factor, others, ref):
  """{(platform, level): Series over seeds} of the runs at every other factor's reference level,
  replicates of a seed averaged."""
  keep = pd.Series(True, index=runs.index)
  for f in others:
    keep &= runs[f].astype(str) == str(ref[f])
  cells = runs[keep].groupby(['platform', factor, 'seed'], sort=True)['value'].mean()
  return {key: group.droplevel([0, 1]) for key, group in cells.groupby(level=[0, 1])}


def definitions(a, b, native, emu):
  """[(key, label, kind, {cell: weight})] of every component of platform a's gap against b."""
  ea, eb = emu[a], emu[b]
  cell = lambda p, e: (p, e)
  return [
      ('G', f'native gap ({a} − {b})', 'gap', {cell(a, native): 1, cell(b, native): -1}),
      ('fid_A', f'fidelity on {a}: native − {ea}', 'fidelity', {cell(a, native): 1, cell(a, ea): -1}),
      ('fid_B', f'fidelity on {b}: native − {eb}', 'fidelity', {cell(b, native): 1, cell(b, eb): -1}),
      ('N_A', f'numerics on {a}: {ea} − {eb}', 'numerics', {cell(a, ea): 1, cell(a, eb): -1}),
      ('N_B', f'numerics on {b}: {ea} − {eb}', 'numerics', {cell(b, ea): 1, cell(b, eb): -1}),
      ('N', f'numerics part: {ea} − {eb}, mean of both platforms', 'numerics total',
       {cell(a, ea): .5, cell(a, eb): -.5, cell(b, ea): .5, cell(b, eb): -.5}),
      ('N_interaction', f'numerics on {a} − on {b}', 'numerics interaction',
       {cell(a, ea): 1, cell(a, eb): -1, cell(b, ea): -1, cell(b, eb): 1}),
      ('P_eA', f'platforms under {ea}: {a} − {b}', 'platform', {cell(a, ea): 1, cell(b, ea): -1}),
      ('P_eB', f'platforms under {eb}: {a} − {b}', 'platform', {cell(a, eb): 1, cell(b, eb): -1}),
      ('P', f'platforms under the same emulated arithmetic, mean of {ea} and {eb}',
       'platform total', {cell(a, ea): .5, cell(b, ea): -.5, cell(a, eb): .5, cell(b, eb): -.5}),
      ('R', 'platform residual: gap − numerics part', 'residual',
       {cell(a, native): 1, cell(b, native): -1, cell(a, ea): -.5, cell(a, eb): .5,
        cell(b, ea): -.5, cell(b, eb): .5}),
  ]


def per_seed(cells, weights, seeds):
  """The component's value per seed: sum of weight x cell mean, over `seeds`."""
  return sum(w * cells[c].loc[seeds].to_numpy() for c, w in weights.items())


def component_stats(d, margin):
  """Estimate, sd, se, df, 95% CI, paired-t p, signed-rank p and d_z of the per-seed values d;
  with a margin also the 90% CI and TOST p."""
  k = len(d)
  mean = float(np.mean(d))
  sd = float(np.std(d, ddof=1)) if k > 1 else np.nan
  se = sd / np.sqrt(k) if k > 1 else np.nan
  low, high = inference.diff_ci(mean, se, k - 1, 0.95) if k > 1 else (np.nan, np.nan)
  if k < 2:
    p = np.nan
  elif se > 0:
    p = float(2 * sps.t.sf(abs(mean) / se, k - 1))
  else:
    p = 1.0 if mean == 0 else 0.0
  _, sr_p, sr_method = inference.signed_rank(d)
  out = {'estimate': mean, 'sd': sd, 'se': se, 'df': k - 1, 'seeds': k, 'ci_low': low,
         'ci_high': high, 'p': p, 'signed_rank_p': sr_p, 'signed_rank_method': sr_method,
         'd_z': inference.d_z(d), 'ci90_low': np.nan, 'ci90_high': np.nan, 'tost_p': np.nan}
  if margin and k > 1:
    out['ci90_low'], out['ci90_high'], out['tost_p'] = inference.tost(mean, se, k - 1, margin)
  return out


def components(cells, a, b, native, emu):
  """(summary, missing): the per-seed values of every estimable component of a's gap against b
  over the seeds common to all cells run, and {key: why not} of the others."""
  present = {c for c in cells}
  defs = definitions(a, b, native, emu)
  used = {c for _, _, _, w in defs for c in w if c in present}
  seeds = sorted(set.intersection(*(set(cells[c].index) for c in used)))
  values, missing, labels, kinds = {}, {}, {}, {}
  for key, label, kind, weights in defs:
    absent = [c for c in weights if c not in present]
    labels[key], kinds[key] = label, kind
    if absent:
      missing[key] = 'not estimable: no runs of ' + ', '.join(f'{e} on {p}' for p, e in absent)
    else:
      values[key] = per_seed(cells, weights, seeds)
  if 'N_A' in values and 'N_B' not in values or 'N_B' in values and 'N_A' not in values:
    only = 'N_A' if 'N_A' in values else 'N_B'  # one platform ran both emulations: N from it alone
    values['N'] = values[only]
    labels['N'] = labels[only] + ' (one platform only)'
    missing.pop('N', None)
    values['R'] = values['G'] - values['N']
    missing.pop('R', None)
  return {'gap': f'{a} - {b}', 'platforms': (a, b), 'profiles': (emu[a], emu[b]), 'seeds': seeds,
          'values': values, 'labels': labels, 'kinds': kinds}, missing


def component_table(summary, missing, margin):
  """One row per component: gap, key, component (label), kind, the component_stats numbers, note
  (why it is not estimable)."""
  rows = []
  for key, label in summary['labels'].items():
    row = {'gap': summary['gap'], 'key': key, 'component': label, 'kind': summary['kinds'][key]}
    if key in summary['values']:
      row.update(component_stats(summary['values'][key], margin if key in ('G', 'R') else None))
      row['note'] = ''
    else:
      row['note'] = missing[key]
    rows.append(row)
  return pd.DataFrame(rows)


def cross_check(runs, factor, others, ref, summary, native):
  """{key: effects.contrast} of G, N and R from a MixedLM over the same cells and seeds (the
  module doc), or {} when the fit fails; named as a cross-check wherever it is shown."""
  a, b = summary['platforms']
  keep = runs['seed'].isin(summary['seeds'])
  for f in others:
    keep &= runs[f].astype(str) == str(ref[f])
  sub = runs[keep].assign(cell=lambda r: r['platform'].astype(str) + '|' + r[factor].astype(str))
  X = effects.design(sub, ['cell'], {'cell': f'{b}|{native}'})
  try:
    model = effects.fit(sub['value'], X, sub['seed'])
  except (ValueError, np.linalg.LinAlgError):
    return {}
  out = {}
  for key, _, _, weights in definitions(a, b, native, dict(zip((a, b), summary['profiles']))):
    if key in ('G', 'N', 'R') and key in summary['values']:
      w = pd.Series({f'cell={p}|{e}': v for (p, e), v in weights.items()
                     if f'cell={p}|{e}' in X}, dtype=float)
      out[key] = effects.contrast(model, w)
  out['method'] = model['method']
  return out


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


def decompose(runs, columns, ref, native, given_map):
  """([summary per gap], emulation map): each platform's gap against the reference platform, its
  per-seed components (components()) and their table, and the cross-check."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  order = sorted(set(runs['platform']))
  base = ref[plat] if plat else order[0]
  emu = default_emulation(runs, nf, order, given_map)
  others = [f for f in columns if f not in (nf, plat)]
  cells = cell_means(runs, nf, others, ref)
  if (base, nl) not in cells:
    raise LookupError(f'no {nf}={nl} run on the reference platform {base} at the other factors\' '
                      'reference levels')
  summaries = []
  for a in order:
    if a != base and (a, nl) in cells:
      summary, missing = components(cells, a, base, nl, emu)
      if len(summary['seeds']) < 2:
        raise LookupError(f'fewer than 2 seeds ran every cell of the {a} - {base} gap')
      summary['missing'] = missing
      summary['cross_check'] = cross_check(runs, nf, others, ref, summary, nl)
      summaries.append(summary)
  if not summaries:
    raise LookupError(f'no platform other than {base} has a {nf}={nl} run')
  return summaries, emu


def summarise(summaries, margin, min_share=None):
  """(component table of every gap, [gap_verdict.judge dict per gap]) at `margin`."""
  tables = [component_table(s, s['missing'], margin) for s in summaries]
  judged = [gap_verdict.judge(s, t, margin, min_share) for s, t in zip(summaries, tables)]
  return pd.concat(tables, ignore_index=True), judged


def section(runs, columns, ref, native, platform_profile, margin, min_share=None):
  """{'table', 'decomposition', 'native', 'emulation', 'summaries', 'note'} of the gap; table None,
  decomposition [] and `note` saying why when it cannot be split."""
  platforms = sorted(set(runs['platform'].astype(str))) if 'platform' in runs else []
  none = lambda note: {'table': None, 'decomposition': [], 'note': note, 'emulation': None,
                       'native': None, 'summaries': []}
  if len(platforms) < 2:
    return none(f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
                'platform gap; each arm minus the reference arm instead')
  if 'seed' not in runs or runs['seed'].isna().all():
    return none('gap decomposition unavailable: no seed column, so no arm pairs with another')
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
    summaries, emu = decompose(runs.assign(platform=runs['platform'].astype(str)), columns, ref,
                               arm, given)
  except LookupError as e:
    return none(f'gap decomposition unavailable: {e.args[0]}; each arm minus the reference arm '
                'instead')
  table, judged = summarise(summaries, margin, min_share)
  return {'table': table, 'note': None, 'native': arm, 'emulation': emu, 'summaries': summaries,
          'decomposition': judged}
