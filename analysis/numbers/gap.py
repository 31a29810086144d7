"""The platform gap of analysis.numbers.attribution, measured as it is named: per seed, from the
paired cell means of the arms that define it, split exactly into what the emulated arithmetic
explains and what it does not. Verdict words: analysis/numbers/gap_verdict.py.

Cells. y(P, e, s) = the metric of seed s on platform P under profile level e, every other declared
factor at its reference level (batchnorm_group=0, f32 activations: arms with another level, e.g.
BN/16 or bf16 activations, never enter), replicates of a seed averaged (a seed: the model unit of
runrecord.rules.model_keys). (A, B) = a platform pair compared: the declaration's `compare`, or
--compare (exploratory), else every pair of the platforms run with A before B in PLATFORM_ORDER
(tpu − gpu, tpu − cpu, gpu − cpu: default_pairs), the question's pair first; nat = the native arm,
eA / eB = the profiles emulating A's / B's native arithmetic (the declaration's platform_profile).
Per seed s:
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
Wilcoxon's signed-rank p and d_z. G and R also get their TOST against the margin. Share
explained s = N / G with Fieller's interval over the same seeds
(analysis.numbers.inference.fieller). A component whose cells were not run is reported as not
estimable, naming the missing cells. Where only one platform X ran both emulating profiles,
N = N_X (labelled "one platform only", and named in the verdict, which it cannot make
"explained" by itself: its interaction with the platform is not tested) and R = G − N_X. Several
pairs: each pair's gap tests (paired t, TOST, signed rank) are Holm-adjusted over the pairs compared
(analysis/numbers/gap_verdict.py judge_family).

Cross-check (named, not the estimator): a MixedLM (random intercept per seed) over the same cells
with one coefficient per cell, the same G, N and R as contrasts of the same cell weights the
estimate used (N_X where N is from one platform; analysis/numbers/effects.py); it assumes one
residual variance for every cell. Both estimates: analysis/numbers/gap_estimates.py.
Reference: docs/statistics.md "The gap decomposition".
"""

import itertools

import pandas as pd

from analysis.numbers import effects, gap_verdict
from analysis.numbers.gap_estimates import component_stats, cross_check, per_seed
from runrecord import rules

KINDS = (
  'gap',
  'fidelity',
  'numerics',
  'numerics total',
  'numerics interaction',
  'platform',
  'platform total',
  'residual',
)


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

  def cell(p, e):
    return (p, e)

  return [
    ('G', f'native gap ({a} − {b})', 'gap', {cell(a, native): 1, cell(b, native): -1}),
    ('fid_A', f'fidelity on {a}: native − {ea}', 'fidelity', {cell(a, native): 1, cell(a, ea): -1}),
    ('fid_B', f'fidelity on {b}: native − {eb}', 'fidelity', {cell(b, native): 1, cell(b, eb): -1}),
    ('N_A', f'numerics on {a}: {ea} − {eb}', 'numerics', {cell(a, ea): 1, cell(a, eb): -1}),
    ('N_B', f'numerics on {b}: {ea} − {eb}', 'numerics', {cell(b, ea): 1, cell(b, eb): -1}),
    (
      'N',
      f'numerics part: {ea} − {eb}, mean of both platforms',
      'numerics total',
      {cell(a, ea): 0.5, cell(a, eb): -0.5, cell(b, ea): 0.5, cell(b, eb): -0.5},
    ),
    (
      'N_interaction',
      f'numerics on {a} − on {b}',
      'numerics interaction',
      {cell(a, ea): 1, cell(a, eb): -1, cell(b, ea): -1, cell(b, eb): 1},
    ),
    ('P_eA', f'platforms under {ea}: {a} − {b}', 'platform', {cell(a, ea): 1, cell(b, ea): -1}),
    ('P_eB', f'platforms under {eb}: {a} − {b}', 'platform', {cell(a, eb): 1, cell(b, eb): -1}),
    (
      'P',
      f'platforms under the same emulated arithmetic, mean of {ea} and {eb}',
      'platform total',
      {cell(a, ea): 0.5, cell(b, ea): -0.5, cell(a, eb): 0.5, cell(b, eb): -0.5},
    ),
    (
      'R',
      'platform residual: gap − numerics part',
      'residual',
      {
        cell(a, native): 1,
        cell(b, native): -1,
        cell(a, ea): -0.5,
        cell(a, eb): 0.5,
        cell(b, ea): -0.5,
        cell(b, eb): 0.5,
      },
    ),
  ]


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
  used = {key: dict(weights) for key, _, _, weights in defs if key in ('G', 'N', 'R')}
  only = None
  if ('N_A' in values) != ('N_B' in values):
    key = 'N_A' if 'N_A' in values else 'N_B'  # one platform ran both emulations: N from it alone
    only = a if key == 'N_A' else b
    values['N'] = values[key]
    labels['N'] = labels[key] + ' (one platform only)'
    missing.pop('N', None)
    values['R'] = values['G'] - values['N']
    labels['R'] = labels['R'] + f' (N from {only} only)'
    missing.pop('R', None)
    used['N'] = dict(next(w for k, _, _, w in defs if k == key))
    used['R'] = {c: used['G'].get(c, 0) - used['N'].get(c, 0) for c in {*used['G'], *used['N']}}
  return {
    'gap': f'{a} - {b}',
    'platforms': (a, b),
    'profiles': (emu[a], emu[b]),
    'seeds': seeds,
    'values': values,
    'labels': labels,
    'kinds': kinds,
    'weights': used,
    'n_only': only,
  }, missing


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


def default_emulation(runs, native_factor, platforms, given):
  """{platform: profile level emulating its native arithmetic}: given, else <p>_default or
  jax_<p>_default when that level exists."""
  lv = set(runs[native_factor])
  out = {}
  for p in platforms:
    guess = [c for c in (f'{p}_default', f'jax_{p}_default') if c in lv]
    out[p] = given.get(p, guess[0] if guess else None)
    if out[p] is None:
      raise LookupError(
        f'no level of {native_factor} emulates {p}; give --platform-profile {p}=LEVEL'
      )
    if out[p] not in lv:
      raise ValueError(
        f'--platform-profile: {native_factor} has no level {out[p]!r}; '
        f'levels: {", ".join(sorted(lv))}'
      )
  return out


def native_arm(runs, columns, given):
  """(factor, level) of the native arm: --native, else a 'profile' factor with a 'native' level."""
  if given:
    ((name, level),) = given.items() if len(given) == 1 else [(None, None)]
    if name is None:
      raise ValueError('--native: give one factor=level, e.g. --native profile=native')
    factor = effects.find_factor(name, columns, '--native')
    if level not in set(runs[factor]):
      raise ValueError(
        f'--native: {factor} has no level {level!r}; levels: '
        f'{", ".join(effects.levels(runs, factor))}'
      )
    return factor, level
  for factor, col in columns.items():
    if col.rsplit('.', 1)[-1] == 'profile' and 'native' in set(runs[factor]):
      return factor, 'native'
  return None


PLATFORM_ORDER = ('tpu', 'gpu', 'cpu')  # the project's question: tpu − gpu, then each against cpu


def platform_rank(platform):
  """Sort key of a platform identity: its JAX platform's place in PLATFORM_ORDER, then the name."""
  kind = rules.jax_platform(platform)
  return (PLATFORM_ORDER.index(kind) if kind in PLATFORM_ORDER else len(PLATFORM_ORDER), platform)


def default_pairs(platforms):
  """Every pair (a, b) of the platforms, a before b in PLATFORM_ORDER (G = a − b), the question's
  pair first: tpu − gpu, tpu − cpu, gpu − cpu."""
  return list(itertools.combinations(sorted(set(platforms), key=platform_rank), 2))


def resolve_platform(name, platforms, flag):
  """The platform identity among `platforms` that `name` means: itself, or the one identity of
  that JAX platform ('cpu' -> 'cpu-AVX512'); None when no run is on it; a ValueError naming `flag`
  when it means several."""
  if name in platforms:
    return name
  same = sorted(p for p in platforms if rules.jax_platform(p) == name)
  if len(same) > 1:
    raise ValueError(f'{flag}: {name!r} means {", ".join(same)}; name one of them')
  return same[0] if same else None


def platform_pairs(platforms, given, flag):
  """(pairs to decompose, notes): `given` ([[a, b], ...], the declaration's compare or --compare)
  resolved to the platforms run, else default_pairs. A given pair whose platform has no runs is
  left out with a note (from --compare it is an error: a typo); a pair given twice is one."""
  if not given:
    return default_pairs(platforms), []
  pairs, notes = [], []
  for a, b in given:
    found = [resolve_platform(str(p), platforms, flag) for p in (a, b)]
    absent = [str(p) for p, f in zip((a, b), found, strict=True) if f is None]
    if absent and flag == '--compare':
      raise ValueError(
        f'--compare: no runs on {", ".join(absent)}; platforms run: {", ".join(sorted(platforms))}'
      )
    if absent:
      notes.append(f'{a} − {b}: no runs on {", ".join(absent)}')
    elif tuple(found) not in pairs and found[0] != found[1]:
      pairs.append(tuple(found))
  return pairs, notes


def decompose(runs, columns, ref, native, given_map, pairs):
  """([summary per pair], emulation map, notes): each pair's (a, b) gap G = a − b, its per-seed
  components (components()) and the cross-check; a pair that cannot be split is left out with a
  note saying why."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  needed = sorted({p for pair in pairs for p in pair})
  emu = default_emulation(runs, nf, needed, given_map)
  others = [f for f in columns if f not in (nf, plat)]
  cells = cell_means(runs, nf, others, ref)
  summaries, notes = [], []
  for a, b in pairs:
    absent = [p for p in (a, b) if (p, nl) not in cells]
    if absent:
      notes.append(
        f"{a} − {b}: no {nf}={nl} run on {', '.join(absent)} at the other factors' reference levels"
      )
      continue
    summary, missing = components(cells, a, b, nl, emu)
    if len(summary['seeds']) < 2:
      notes.append(f'{a} − {b}: fewer than 2 seeds ran every cell of the gap')
      continue
    summary['missing'] = missing
    summary['cross_check'] = cross_check(runs, nf, others, ref, summary, nl)
    summaries.append(summary)
  if not summaries:
    raise LookupError('; '.join(notes) or 'no platform pair to compare')
  return summaries, {p: emu[p] for p in needed}, notes


def summarise(summaries, margin, min_share=None):
  """(component table of every gap, [gap_verdict.judge dict per gap]) at `margin`, the gaps' tests
  Holm-adjusted over the pairs compared (gap_verdict.judge_family)."""
  tables = [component_table(s, s['missing'], margin) for s in summaries]
  judged = gap_verdict.judge_family(summaries, tables, margin, min_share)
  return pd.concat(tables, ignore_index=True), judged


def section(
  runs,
  columns,
  ref,
  native,
  platform_profile,
  margin,
  min_share=None,
  compare=None,
  compare_flag='compare',
):
  """{'table', 'decomposition', 'native', 'emulation', 'summaries', 'note', 'pairs_note'} of the
  gap of each platform pair (`compare`: the declaration's or --compare's [[a, b], ...] named by
  `compare_flag`; default_pairs without); table None, decomposition [] and `note` saying why when
  none can be split; `pairs_note`: the pairs left out and why."""
  platforms = sorted(set(runs['platform'].astype(str))) if 'platform' in runs else []

  def none(note):
    return {
      'table': None,
      'decomposition': [],
      'note': note,
      'emulation': None,
      'native': None,
      'summaries': [],
      'pairs_note': '',
    }

  if len(platforms) < 2:
    return none(
      f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
      'platform gap; each arm minus the reference arm instead'
    )
  pairs, left_out = platform_pairs(platforms, compare, compare_flag)
  if 'seed' not in runs or runs['seed'].isna().all():
    return none('gap decomposition unavailable: no seed column, so no arm pairs with another')
  arm = native_arm(runs, columns, effects.parse_pairs(native, '--native'))
  if arm is None:
    return none(
      'gap decomposition unavailable: no native arm (give --native factor=level); '
      'each arm minus the reference arm instead'
    )
  given = effects.parse_pairs(platform_profile, '--platform-profile')
  bad = set(given) - set(platforms)
  if bad:
    raise ValueError(
      f'--platform-profile: no runs on {", ".join(sorted(bad))}; platforms: {", ".join(platforms)}'
    )
  try:
    if not pairs:
      raise LookupError('none of the declared platform pairs ran (' + '; '.join(left_out) + ')')
    summaries, emu, notes = decompose(
      runs.assign(platform=runs['platform'].astype(str)), columns, ref, arm, given, pairs
    )
  except LookupError as e:
    return none(
      f'gap decomposition unavailable: {e.args[0]}; each arm minus the reference arm instead'
    )
  table, judged = summarise(summaries, margin, min_share)
  return {
    'table': table,
    'note': None,
    'native': arm,
    'emulation': emu,
    'summaries': summaries,
    'decomposition': judged,
    'pairs_note': '; '.join(left_out + notes),
  }
