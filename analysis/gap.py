"""A platform pair's native gap, per seed from its cell means: G = fid_A − fid_B + N + P exactly,
R = G − N, each component's mean with its t-interval, the share N / G, the tests and the verdict
(docs/statistics.md "The gap decomposition")."""

import dataclasses
import difflib
import itertools
from typing import Any, NamedTuple, Optional

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import declaration, inference
from runrecord import rules

PLATFORM_ORDER = ('tpu', 'gpu', 'cpu')  # the project's question: tpu − gpu, then each against cpu
KEYS = ('G', 'fid_A', 'fid_B', 'N_A', 'N_B', 'N', 'N_interaction', 'P_eA', 'P_eB', 'P', 'R')
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
RESIDUAL_SHARE = 0.25  # a residual shown ≠ 0 and above this share of the gap is said beside it


class Estimate(NamedTuple):
  """A component over seeds or a contrast of a fit: estimate, se, 95% interval, p."""

  estimate: float
  se: float
  ci_low: float
  ci_high: float
  p: float


class Tost(NamedTuple):
  """An equivalence test against ±margin: its 90% interval and p."""

  ci90_low: float
  ci90_high: float
  p: float


class CrossCheck(NamedTuple):
  """The MixedLM over a gap's cells and seeds: G, N, R (or why not); empty when its fit fails."""

  method: str = ''
  contrasts: dict[str, Estimate] = {}
  notes: dict[str, str] = {}


class Flags(NamedTuple):
  """What a gap's verdict rests on (flags)."""

  gap_shown: bool
  gap_equivalent: bool
  rank_shown: bool
  tests_disagree: bool
  numerics_shown: bool
  numerics_opposite: bool
  numerics_one_platform: bool
  interaction_shown: bool
  share_reaches: bool
  residual_equivalent: bool
  residual_shown: bool


@dataclasses.dataclass(frozen=True)
class GapSummary:
  """One platform pair's gap: each component's per-seed `values`, label, kind and cell weights."""

  gap: str
  platforms: tuple[str, str]
  profiles: tuple[str, str]
  seeds: list[Any]
  values: dict[str, np.ndarray]
  labels: dict[str, str]
  kinds: dict[str, str]
  weights: dict[str, dict[tuple[str, str], float]]
  n_only: Optional[str]
  missing: dict[str, str]
  cross_check: CrossCheck = CrossCheck()


@dataclasses.dataclass(frozen=True)
class Decomposition:
  """One platform pair's gap judged: its components, tests, share, flags and verdict."""

  gap: str
  platforms: tuple[str, str]
  profiles: tuple[str, str]
  margin: Optional[float]
  min_share: float
  seed_list: list[Any]
  missing: dict[str, str]
  N_estimable: bool
  cross_check: CrossCheck
  N_label: str
  N_only: Optional[str]
  G: Estimate
  fid_A: Estimate
  fid_B: Estimate
  N_A: Estimate
  N_B: Estimate
  N: Estimate
  N_interaction: Estimate
  P_eA: Estimate
  P_eB: Estimate
  P: Estimate
  R: Estimate
  G_tost: Tost
  R_tost: Tost
  seeds_needed: dict[str, int]
  G_signed_rank_p: float
  G_signed_rank_method: str
  G_signed_rank_attainable: float
  G_seeds_positive: int
  G_seeds_negative: int
  G_d_z: float
  share: float
  share_ci_low: float
  share_ci_high: float
  share_method: str
  G_p_holm: float = np.nan
  G_tost_p_holm: float = np.nan
  G_signed_rank_p_holm: float = np.nan
  pairs_compared: int = 1
  flags: Optional[Flags] = None
  verdict: str = ''
  open: str = ''

  @property
  def seeds(self):
    return len(self.seed_list)

  def row(self):
    """attribution_decomposition.csv's row: every number, flag and the verdict."""
    a, b = self.platforms
    row = {'platform_a': a, 'platform_b': b, 'gap': self.gap, 'margin': self.margin}
    row.update(min_share=self.min_share, seeds=self.seeds, N_estimable=self.N_estimable)
    row.update(N_label=self.N_label, N_only=self.N_only)
    for key in KEYS:
      c = getattr(self, key)
      row.update({key: c.estimate, f'{key}_se': c.se, f'{key}_ci_low': c.ci_low})
      row.update({f'{key}_ci_high': c.ci_high, f'{key}_p': c.p})
    for key, tost in (('G', self.G_tost), ('R', self.R_tost)):
      row.update({f'{key}_ci90_low': tost.ci90_low, f'{key}_ci90_high': tost.ci90_high})
      row[f'{key}_tost_p'] = tost.p
    names = [f.name for f in dataclasses.fields(self)]
    for name in names[names.index('G_signed_rank_p') : names.index('pairs_compared') + 1]:
      row[name] = getattr(self, name)  # the tests of G, the share and the Holm p-values
    row.update(self.flags._asdict() if self.flags else {})
    row.update(verdict=self.verdict, open=self.open, profile_a=self.profiles[0])
    row.update(profile_b=self.profiles[1], seeds_used=' '.join(map(str, self.seed_list)))
    row['not_estimable'] = '; '.join(f'{k}: {v}' for k, v in self.missing.items())
    for key in ('G', 'N', 'R'):
      c = self.cross_check.contrasts.get(key)
      row[f'{key}_mixed_model'] = c.estimate if c else np.nan
      row[f'{key}_mixed_model_ci_low'] = c.ci_low if c else np.nan
      row[f'{key}_mixed_model_ci_high'] = c.ci_high if c else np.nan
      row[f'{key}_mixed_model_note'] = self.cross_check.notes.get(key, '')
    row.update({f'seeds_for_{q.replace(" ", "_")}': n for q, n in self.seeds_needed.items()})
    return row


def at_reference(runs, others, ref):
  """Which runs hold every factor of `others` at its reference level."""
  keep = pd.Series(True, index=runs.index)
  for f in others:
    keep &= runs[f].astype(str) == str(ref[f])
  return keep


def cell_means(runs, factor, others, ref):
  """{(platform, level): Series over seeds} at the other factors' reference levels (replicates
  averaged)."""
  cells = runs[at_reference(runs, others, ref)]
  cells = cells.groupby(['platform', factor, 'seed'], sort=True)['value'].mean()
  return {key: group.droplevel([0, 1]) for key, group in cells.groupby(level=[0, 1])}


def definitions(a, b, native, emu):
  """[(key, label, kind, {cell: weight})] of every component of platform a's gap against b."""
  ea, eb = emu[a], emu[b]
  mean_n = {(a, ea): 0.5, (a, eb): -0.5, (b, ea): 0.5, (b, eb): -0.5}
  mean_p = {(a, ea): 0.5, (b, ea): -0.5, (a, eb): 0.5, (b, eb): -0.5}
  across = {(a, ea): 1, (a, eb): -1, (b, ea): -1, (b, eb): 1}
  residual = {(a, native): 1, (b, native): -1, **{c: -w for c, w in mean_n.items()}}
  return [
    ('G', f'native gap ({a} − {b})', 'gap', {(a, native): 1, (b, native): -1}),
    ('fid_A', f'fidelity on {a}: native − {ea}', 'fidelity', {(a, native): 1, (a, ea): -1}),
    ('fid_B', f'fidelity on {b}: native − {eb}', 'fidelity', {(b, native): 1, (b, eb): -1}),
    ('N_A', f'numerics on {a}: {ea} − {eb}', 'numerics', {(a, ea): 1, (a, eb): -1}),
    ('N_B', f'numerics on {b}: {ea} − {eb}', 'numerics', {(b, ea): 1, (b, eb): -1}),
    ('N', f'numerics part: {ea} − {eb}, mean of both platforms', 'numerics total', mean_n),
    ('N_interaction', f'numerics on {a} − on {b}', 'numerics interaction', across),
    ('P_eA', f'platforms under {ea}: {a} − {b}', 'platform', {(a, ea): 1, (b, ea): -1}),
    ('P_eB', f'platforms under {eb}: {a} − {b}', 'platform', {(a, eb): 1, (b, eb): -1}),
    (
      'P',
      f'platforms under the same emulated arithmetic, mean of {ea} and {eb}',
      'platform total',
      mean_p,
    ),
    ('R', 'platform residual: gap − numerics part', 'residual', residual),
  ]


def components(cells, a, b, native, emu):
  """The GapSummary of a's gap against b over the seeds common to every cell run."""
  present = set(cells)
  defs = definitions(a, b, native, emu)
  used = {c for _, _, _, w in defs for c in w if c in present}
  seeds = sorted(set.intersection(*(set(cells[c].index) for c in used)))
  values, missing, labels, kinds = {}, {}, {}, {}
  for key, label, kind, weights in defs:
    absent = [c for c in weights if c not in present]
    labels[key], kinds[key] = label, kind
    if absent:
      missing[key] = 'not estimable: no runs of ' + ', '.join(f'{e} on {p}' for p, e in absent)
    else:  # per seed: the sum of weight x cell mean
      values[key] = sum(w * cells[c].loc[seeds].to_numpy() for c, w in weights.items())
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
  return GapSummary(
    f'{a} - {b}', (a, b), (emu[a], emu[b]), seeds, values, labels, kinds, used, only, missing
  )


def component_stats(d, margin):
  """Estimate, sd, se, df, 95% CI, paired-t p, signed-rank p and d_z of the per-seed values d
  (2 seeds or more: decompose drops a pair with fewer)."""
  k, mean, sd = len(d), float(np.mean(d)), inference.spread_sd(d)
  se = sd / np.sqrt(k)
  low, high = inference.diff_ci(mean, se, k - 1, 0.95)
  p = float(2 * sps.t.sf(abs(mean) / se, k - 1)) if se > 0 else inference.exact(mean)[1]
  _, sr_p, sr_method = inference.signed_rank(d)
  tost = inference.tost(mean, se, k - 1, margin) if margin else (np.nan,) * 3
  out = dict(estimate=mean, sd=sd, se=se, df=k - 1, seeds=k, ci_low=low, ci_high=high, p=p)
  out.update(signed_rank_p=sr_p, signed_rank_method=sr_method, d_z=inference.d_z(d))
  return {**out, **dict(zip(('ci90_low', 'ci90_high', 'tost_p'), tost, strict=True))}


def component_table(summary, margin):
  """One row per component (attribution_gap.csv): gap, key, component (label), kind."""
  rows = []
  for key, label in summary.labels.items():
    row = {'gap': summary.gap, 'key': key, 'component': label, 'kind': summary.kinds[key]}
    if key in summary.values:
      row.update(component_stats(summary.values[key], margin if key in ('G', 'R') else None))
      row['note'] = ''
    else:
      row['note'] = summary.missing[key]
    rows.append(row)
  return pd.DataFrame(rows)


def default_emulation(runs, native_factor, platforms, given):
  """{platform: the level emulating its native arithmetic}: given, else <p>_default."""
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


def default_pairs(platforms):
  """Every pair (a, b) of the platforms, a before b in PLATFORM_ORDER: tpu − gpu first."""
  rank = {kind: i for i, kind in enumerate(PLATFORM_ORDER)}  # then by name
  ranked = sorted(set(platforms), key=lambda p: (rank.get(rules.jax_platform(p), len(rank)), p))
  return list(itertools.combinations(ranked, 2))


def resolve_platform(name, platforms, flag):
  """The platform identity `name` means ('cpu' -> 'cpu-AVX512'); None without runs."""
  name = name if name in platforms else name.lower()  # run labels are lower-cased
  if name in platforms:
    return name
  same = sorted(p for p in platforms if rules.jax_platform(p) == name)
  if len(same) > 1:
    raise ValueError(f'{flag}: {name!r} means {", ".join(same)}; name one of them')
  return same[0] if same else None


def platform_pairs(platforms, given, flag):
  """(pairs to decompose, notes): `given` resolved to the platforms run, else default_pairs."""
  if not given:
    return default_pairs(platforms), []
  pairs, notes = [], []
  for a, b in given:
    found = [resolve_platform(str(p), platforms, flag) for p in (a, b)]
    absent = [str(p) for p, f in zip((a, b), found, strict=True) if f is None]
    if absent and flag != 'compare':  # checked before any statistic; not the re-analyses
      close = difflib.get_close_matches(absent[0].lower(), platforms, n=1)
      near = f' (nearest: {close[0]})' if close else ''
      ran = ', '.join(sorted(platforms))
      raise ValueError(f'{flag}: no runs on {", ".join(absent)}{near}; platforms run: {ran}')
    if absent:
      notes.append(f'{a} − {b}: no runs on {", ".join(absent)}')
    elif tuple(found) not in pairs and found[0] != found[1]:
      pairs.append(tuple(found))
  return pairs, notes


def summarise(summaries, margin, min_share=None):
  """(component table of every gap, [Decomposition per gap]) at `margin`."""
  tables = [component_table(s, margin) for s in summaries]
  judged = judge_family(summaries, tables, margin, min_share)
  return pd.concat(tables, ignore_index=True), judged


def shown(low, high):
  """+1 when a 95% CI lies above 0, -1 below, 0 when it includes 0 (or is NaN)."""
  return 1 if low > 0 else -1 if high < 0 else 0


def flags(d):
  """The verdict's inputs (Flags) from a Decomposition's numbers, after its Holm p-values."""
  k = d.pairs_compared
  t_shows = bool(d.G_p_holm < inference.ALPHA)
  rank_shows = bool(d.G_signed_rank_p_holm < inference.ALPHA)
  rank_can = bool(d.G_signed_rank_attainable * k < inference.ALPHA)
  sign = int(np.sign(d.G.estimate)) if t_shows else 0
  n_sign = shown(d.N.ci_low, d.N.ci_high) if d.N_estimable else 0
  return Flags(
    gap_shown=t_shows,
    gap_equivalent=bool(d.G_tost_p_holm < inference.ALPHA),
    rank_shown=rank_shows,
    tests_disagree=rank_shows != t_shows and (rank_shows or rank_can),
    numerics_shown=bool(sign) and n_sign == sign,
    numerics_opposite=bool(sign) and n_sign == -sign,
    numerics_one_platform=bool(d.N_only),
    interaction_shown=bool(shown(d.N_interaction.ci_low, d.N_interaction.ci_high)),
    share_reaches=bool(d.share_ci_low >= d.min_share),
    residual_equivalent=bool(d.R_tost.p < inference.ALPHA),
    residual_shown=bool(d.N_estimable and shown(d.R.ci_low, d.R.ci_high)),
  )


def verdict(f, margin, n_estimable=True):
  """(verdict, open part) from Flags (docs/statistics.md "The gap decomposition")."""
  m = f'±{margin:g}' if margin else 'a margin (none given)'
  if f.tests_disagree:
    which = (
      'the signed-rank test rejects 0, the t-interval does not (a seed far from the others '
      'widens it)'
      if f.rank_shown
      else 'the t-interval excludes 0, the signed-rank test does not (the mean rests on a few '
      'seeds)'
    )
    return 'tests disagree', which + (
      f'; within {m} by TOST' if f.gap_equivalent else f'; not shown within {m}'
    )
  if not f.gap_shown and f.gap_equivalent:
    return 'no gap', ''
  if not f.gap_shown:
    return 'inconclusive', f'the gap: neither shown nor within {m}'
  if f.gap_equivalent:
    return 'gap within margin', ''
  if not n_estimable:
    return 'inconclusive', 'the numerics part: not estimable from the arms run'
  if f.numerics_shown:
    why = [
      w
      for ok, w in (
        (f.share_reaches, "the share's lower bound is below the minimum"),
        (f.residual_equivalent, f'the residual is not within {m}'),
        (not f.numerics_one_platform, 'the numerics part is measured on one platform only'),
      )
      if not ok
    ]
    return ('explained by numerics', '') if not why else ('partly explained', '; '.join(why))
  if f.residual_shown:
    return 'not explained', ''
  return (
    'inconclusive',
    f'the numerics part (not shown) and the residual (not shown, not within {m})',
  )


def seeds_needed(table, margin):
  """{question: seeds} for 80% power (paired t, alpha 0.05) at the observed per-seed sds."""
  if not margin:
    return {}
  row = {r['key']: r for _, r in table.iterrows() if r['note'] == ''}

  def need(key, which):
    return inference.seeds_needed(row[key]['sd'], margin, True)[which]

  out = {'gap nonzero': need('G', 0)}
  if 'N' in row:
    out['numerics part nonzero'] = need('N', 0)
  out['gap within margin'] = need('G', 1)
  if 'R' in row:
    out['residual within margin'] = need('R', 1)
  return out


def judge(summary, table, margin, min_share=None):
  """One gap's Decomposition (before Holm) from its component table (component_table)."""
  rows = table.set_index('key')

  def values(key, columns):
    return [float(rows.loc[key, c]) if rows.loc[key, 'note'] == '' else np.nan for c in columns]

  n_estimable = 'N' in summary.values
  g = np.asarray(summary.values['G'], float)
  share = inference.fieller(summary.values['N'], g) if n_estimable else (np.nan,) * 3
  return Decomposition(
    gap=summary.gap,
    platforms=summary.platforms,
    profiles=summary.profiles,
    margin=margin,
    min_share=MIN_SHARE if min_share is None else min_share,
    seed_list=list(summary.seeds),
    missing=dict(summary.missing),
    N_estimable=n_estimable,
    cross_check=summary.cross_check,
    N_label=summary.labels['N'],
    N_only=summary.n_only,
    **{key: Estimate(*values(key, Estimate._fields)) for key in KEYS},
    G_tost=Tost(*values('G', ('ci90_low', 'ci90_high', 'tost_p'))),
    R_tost=Tost(*values('R', ('ci90_low', 'ci90_high', 'tost_p'))),
    G_signed_rank_p=float(rows.loc['G', 'signed_rank_p']),
    G_signed_rank_method=rows.loc['G', 'signed_rank_method'],
    G_signed_rank_attainable=inference.signed_rank(np.abs(g))[1],
    G_seeds_positive=int((g > 0).sum()),
    G_seeds_negative=int((g < 0).sum()),
    G_d_z=float(rows.loc['G', 'd_z']),
    share=share[0],
    share_ci_low=share[1],
    share_ci_high=share[2],
    share_method="Fieller's interval over seeds",
    seeds_needed=seeds_needed(table, margin),
  )


def judge_family(summaries, tables, margin, min_share=None):
  """[Decomposition per pair]: each gap test (paired t, TOST)."""
  judged = [judge(s, t, margin, min_share) for s, t in zip(summaries, tables, strict=True)]
  t = inference.holm([d.G.p for d in judged])
  tost = inference.holm([d.G_tost.p for d in judged])
  rank = inference.holm([d.G_signed_rank_p for d in judged])
  out = []
  for i, d in enumerate(judged):
    d = dataclasses.replace(
      d,
      G_p_holm=float(t[i]),
      G_tost_p_holm=float(tost[i]),
      G_signed_rank_p_holm=float(rank[i]),
      pairs_compared=len(judged),
    )
    f = flags(d)
    said, open_part = verdict(f, d.margin, d.N_estimable)
    share = abs(d.R.estimate / d.G.estimate) if d.G.estimate else np.inf
    if said == 'explained by numerics' and f.residual_shown and share > RESIDUAL_SHARE:
      open_part = f'a residual ≠ 0 is shown, {share:.0%} of the gap (over {RESIDUAL_SHARE:.0%})'
    out.append(dataclasses.replace(d, flags=f, verdict=said, open=open_part))
  return out
