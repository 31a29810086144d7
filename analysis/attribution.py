"""Which numerical setting explains a difference: factor effects from a seed mixed model, and each
platform pair's native gap split into a numerics part and a residual (docs/statistics.md)."""

import dataclasses
import difflib
import itertools
import warnings
from typing import Any, NamedTuple, Optional

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats as sps

from analysis import declaration, inputs, stats
from analysis.declaration import resolve_column
from runrecord import record, rules

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


class KindEffect(NamedTuple):
  """A blocked platform's `kind` − `base` at the native arm: the mean per-seed difference, 95% t."""

  platform: str
  kind: str
  base: str
  estimate: float
  ci_low: float
  ci_high: float
  seeds: tuple


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


def kind_blocks(runs):
  """{recorded platform: [its device kinds' platform names]} of the platforms split by device
  kind (inputs.split_device_kinds), for a study that declares device_kinds 'blocked'."""
  if inputs.RECORDED_PLATFORM not in runs:
    return {}
  names = runs[['platform', inputs.RECORDED_PLATFORM]].astype(str)
  split = names[names['platform'] != names[inputs.RECORDED_PLATFORM]].drop_duplicates()
  blocks = {p: sorted(g['platform']) for p, g in split.groupby(inputs.RECORDED_PLATFORM)}
  unknown = names['platform'].isin(blocks)  # runs of a split platform that recorded no kind
  if unknown.any():
    p = names['platform'][unknown].iloc[0]
    raise ValueError(
      f"device_kinds 'blocked': {int(unknown.sum())} run(s) on {p} recorded no device_kind beside "
      f'runs on {len(blocks[p])} kinds, so their block is unknown; fill their device_kind or '
      "declare device_kinds 'split'"
    )
  return blocks


def pooled_names(blocks):
  """{a device kind's platform: the platform it is blocked in} of kind_blocks' `blocks`."""
  return {k: p for p, ks in blocks.items() for k in ks}


def block_cells(cells, blocks):
  """`cells` with a cell per blocked platform and level: per seed, the mean over its device kinds'
  cells, on the seeds every kind ran (the kind a blocking factor, each kind weighted alike)."""
  out = dict(cells)
  for platform, kinds in blocks.items():
    for level in sorted({lv for p, lv in cells if p in kinds}, key=str):
      parts = [cells.get((k, level)) for k in kinds]
      if all(x is not None for x in parts):
        joined = pd.concat(parts, axis=1, join='inner')
        if len(joined):
          out[(platform, level)] = joined.mean(axis=1)
  return out


def missing_kinds(cells, kinds, platform, level):
  """How a gap names a blocked platform's absent cell: the kinds that lack `level`."""
  if lacking := [k for k in kinds if (k, level) not in cells]:
    return f'{", ".join(lacking)} (blocked in {platform}: every kind needs it)'
  return f'{platform} (its kinds share no seed there; blocking needs each seed on every kind)'


def kind_effects(cells, blocks, level):
  """[KindEffect] of each blocked platform's kinds after its first, at the native arm `level`."""
  out = []
  for platform, (base, *others) in blocks.items():
    for kind in others:
      if (kind, level) in cells and (base, level) in cells:
        d = (cells[(kind, level)] - cells[(base, level)]).dropna()
        low, high = stats.t_ci(d.to_numpy())
        seeds = tuple(sorted(d.index, key=inputs.seed_key))
        out.append(KindEffect(platform, kind, base, float(d.mean()), low, high, seeds))
  return out


def weights(*terms):
  """{cell: weight} of (cell, weight) terms, summed per cell: where one profile emulates both
  platforms their cells meet and cancel (a dict literal would keep one of them)."""
  out = {}
  for cell, w in terms:
    out[cell] = out.get(cell, 0) + w
  return out


def definitions(a, b, native, emu):
  """[(key, label, kind, {cell: weight})] of every component of platform a's gap against b."""
  ea, eb = emu[a], emu[b]

  def minus(x, y, half=1):
    return weights((x, half), (y, -half))

  mean_n = weights(*minus((a, ea), (a, eb), 0.5).items(), *minus((b, ea), (b, eb), 0.5).items())
  mean_p = weights(*minus((a, ea), (b, ea), 0.5).items(), *minus((a, eb), (b, eb), 0.5).items())
  across = weights(*minus((a, ea), (a, eb)).items(), ((b, ea), -1), ((b, eb), 1))
  gap = minus((a, native), (b, native))
  residual = weights(*gap.items(), *((c, -w) for c, w in mean_n.items()))
  same = f'platforms under the same emulated arithmetic, mean of {ea} and {eb}'
  one = f' (0: {ea} emulates both)' if ea == eb else ''
  return [
    ('G', f'native gap ({a} − {b})', 'gap', gap),
    ('fid_A', f'fidelity on {a}: native − {ea}', 'fidelity', minus((a, native), (a, ea))),
    ('fid_B', f'fidelity on {b}: native − {eb}', 'fidelity', minus((b, native), (b, eb))),
    ('N_A', f'numerics on {a}: {ea} − {eb}{one}', 'numerics', minus((a, ea), (a, eb))),
    ('N_B', f'numerics on {b}: {ea} − {eb}{one}', 'numerics', minus((b, ea), (b, eb))),
    ('N', f'numerics part: {ea} − {eb}, mean of both platforms{one}', 'numerics total', mean_n),
    ('N_interaction', f'numerics on {a} − on {b}', 'numerics interaction', across),
    ('P_eA', f'platforms under {ea}: {a} − {b}', 'platform', minus((a, ea), (b, ea))),
    ('P_eB', f'platforms under {eb}: {a} − {b}', 'platform', minus((a, eb), (b, eb))),
    ('P', same, 'platform total', mean_p),
    ('R', 'platform residual: gap − numerics part', 'residual', residual),
  ]


def components(cells, a, b, native, emu, where=None):
  """The GapSummary of a's gap against b over the seeds common to every cell run; `where`:
  {platform: how a missing cell names it} (a blocked platform's kinds that lack it)."""
  present = set(cells)
  defs = definitions(a, b, native, emu)
  used = {c for _, _, _, w in defs for c in w if c in present}
  seeds = sorted(set.intersection(*(set(cells[c].index) for c in used)))
  values, missing, labels, kinds = {}, {}, {}, {}
  for key, label, kind, weights in defs:
    absent = [c for c in weights if c not in present]
    labels[key], kinds[key] = label, kind
    if absent:
      on = [f'{e} on {(where or {}).get((p, e), p)}' for p, e in absent]
      missing[key] = 'not estimable: no runs of ' + ', '.join(on)
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
  k, mean, sd = len(d), float(np.mean(d)), stats.spread_sd(d)
  se = sd / np.sqrt(k)
  low, high = stats.diff_ci(mean, se, k - 1, 0.95)
  p = float(2 * sps.t.sf(abs(mean) / se, k - 1)) if se > 0 else stats.exact(mean)[1]
  _, sr_p, sr_method = stats.signed_rank(d)
  tost = stats.tost(mean, se, k - 1, margin) if margin else (np.nan,) * 3
  out = dict(estimate=mean, sd=sd, se=se, df=k - 1, seeds=k, ci_low=low, ci_high=high, p=p)
  out.update(signed_rank_p=sr_p, signed_rank_method=sr_method, d_z=stats.d_z(d))
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
    kind = rules.jax_platform(p)  # a platform split by device kind: its JAX platform's default
    guess = [c for k in (p, kind) for c in (f'{k}_default', f'jax_{k}_default') if c in lv]
    out[p] = given.get(p, guess[0] if guess else None)
    if out[p] is None:
      raise LookupError(
        f"no level of {native_factor} emulates {p}; name it in the study's platform_profile "
        f'(analysis.attribute: --platform-profile {p}=LEVEL)'
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


def resolve_platform(name, platforms):
  """The platform identities `name` means ('cpu' -> ['cpu-AVX512'], 'gpu' -> each device kind's
  when split: inputs.split_device_kinds); [] without runs."""
  name = name if name in platforms else name.lower()  # run labels are lower-cased
  if name in platforms:
    return [name]
  return sorted(p for p in platforms if rules.jax_platform(p) == name)


def platform_pairs(platforms, given, flag):
  """(pairs to decompose, notes): `given` resolved to the platforms run, else default_pairs."""
  if not given:
    return default_pairs(platforms), []
  pairs, notes = [], []
  for a, b in given:
    found = [resolve_platform(str(p), platforms) for p in (a, b)]
    absent = [str(p) for p, f in zip((a, b), found, strict=True) if not f]
    if absent and flag != 'compare':  # checked before any statistic; not the re-analyses
      close = difflib.get_close_matches(absent[0].lower(), platforms, n=1)
      near = f' (nearest: {close[0]})' if close else ''
      ran = ', '.join(sorted(platforms))
      raise ValueError(f'{flag}: no runs on {", ".join(absent)}{near}; platforms run: {ran}')
    if absent:
      notes.append(f'{a} − {b}: no runs on {", ".join(absent)}')
    else:  # a platform split by device kind: each kind its own pair
      pairs += [(x, y) for x in found[0] for y in found[1] if x != y and (x, y) not in pairs]
  return pairs, notes


def shown(low, high):
  """+1 when a 95% CI lies above 0, -1 below, 0 when it includes 0 (or is NaN)."""
  return 1 if low > 0 else -1 if high < 0 else 0


def flags(d):
  """The verdict's inputs (Flags) from a Decomposition's numbers, after its Holm p-values."""
  k = d.pairs_compared
  t_shows = bool(d.G_p_holm < stats.ALPHA)
  rank_shows = bool(d.G_signed_rank_p_holm < stats.ALPHA)
  rank_can = bool(d.G_signed_rank_attainable * k < stats.ALPHA)
  sign = int(np.sign(d.G.estimate)) if t_shows else 0
  n_sign = shown(d.N.ci_low, d.N.ci_high) if d.N_estimable else 0
  return Flags(
    gap_shown=t_shows,
    gap_equivalent=bool(d.G_tost_p_holm < stats.ALPHA),
    rank_shown=rank_shows,
    tests_disagree=rank_shows != t_shows and (rank_shows or rank_can),
    numerics_shown=bool(sign) and n_sign == sign,
    numerics_opposite=bool(sign) and n_sign == -sign,
    numerics_one_platform=bool(d.N_only),
    interaction_shown=bool(shown(d.N_interaction.ci_low, d.N_interaction.ci_high)),
    share_reaches=bool(d.share_ci_low >= d.min_share),
    residual_equivalent=bool(d.R_tost.p < stats.ALPHA),
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
    return stats.seeds_needed(row[key]['sd'], margin, True)[which]

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
  share = stats.fieller(summary.values['N'], g) if n_estimable else (np.nan,) * 3
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
    G_signed_rank_attainable=stats.signed_rank(np.abs(g))[1],
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
  t = stats.holm([d.G.p for d in judged])
  tost = stats.holm([d.G_tost.p for d in judged])
  rank = stats.holm([d.G_signed_rank_p for d in judged])
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


CSV_COLUMNS = ['term', 'estimate', 'ci_low', 'ci_high', 'p']
MIXED_MAX_ROWS = 20_000  # MixedLM loops over the seeds every iteration (BENCHMARKS.md)
MEMORY_LIMIT_GB = 2.0
DESIGN_COPIES = 6  # runs x columns arrays alive at once in a fit (design, demeaned, pinv, scores)
FAILED_FIT = ('boundary', 'singular', 'Hessian')  # words of MixedLM warnings that void its fit


@dataclasses.dataclass(frozen=True)
class Attribution:
  """The fitted effects (`terms`, `model`, `method`) and the platform gap: its component table
  `gap` (or `gap_note`, why none) and one `decomposition` per pair, the question's first."""

  metric: str
  source: str
  reference: dict[str, Any]
  margin: Optional[float]
  margin_reason: Optional[str]
  unit: str
  model: str
  method: str
  terms: pd.DataFrame
  n_runs: int
  excluded: pd.DataFrame
  replicates: pd.DataFrame
  noise: dict[str, stats.NoiseFloor]
  min_share: Optional[float]
  gap: Optional[pd.DataFrame] = None
  gap_note: Optional[str] = None
  emulation: Optional[dict[str, Any]] = None
  native: Optional[tuple[str, Any]] = None
  decomposition: list[Decomposition] = dataclasses.field(default_factory=list)
  gap_summaries: list[GapSummary] = dataclasses.field(default_factory=list)
  arms: Optional[pd.DataFrame] = None
  labels: dict[str, str] = dataclasses.field(default_factory=dict)
  pairs_note: str = ''
  compare_flag: Optional[str] = None
  device_kinds: str = 'split'  # or 'blocked': see kind_blocks
  kind_effects: list[KindEffect] = dataclasses.field(default_factory=list)


def parse_pairs(items, flag):
  """['profile=native', ...] (or a dict) -> {'profile': 'native'}."""
  if isinstance(items, dict):
    return {str(k): str(v) for k, v in items.items()}
  out = {}
  for item in [items] if isinstance(items, str) else items or ():
    name, eq, value = str(item).partition('=')
    if not (eq and name and value):
      raise ValueError(f'{flag}: {item!r} is not factor=level; write e.g. {flag} profile=native')
    out[name] = value
  return out


def levels(runs, factor):
  """A factor's levels, sorted (numbers numerically)."""
  return sorted(runs[factor].unique(), key=inputs.seed_key)


def find_factor(name, columns, flag):
  """The --factors name that `name` means (as written, or resolving to the same column)."""
  for factor, col in columns.items():
    if name == factor or col in declaration.column_names(name):
      return factor
  raise ValueError(f'{flag}: {name!r} is not one of --factors ({", ".join(columns)}); add it there')


def design(runs, factors, ref, interactions=()):
  """Treatment-coded design (Intercept, `factor=level`, `A=a:B=b`); confounded terms refused."""
  counts = {f: runs[f].nunique() for f in factors}
  k = 1 + sum(c - 1 for c in counts.values())
  for a, b in interactions:
    cells = runs.loc[(runs[a] != ref[a]) & (runs[b] != ref[b]), [a, b]]
    k += len(cells.drop_duplicates())
  gb = len(runs) * k * 8 * DESIGN_COPIES / 1024**3
  if gb > MEMORY_LIMIT_GB:
    widest = max(counts, key=counts.get)
    raise ValueError(
      f'--factors: the model would need {k:,} columns for {len(runs):,} runs (about {gb:.1f} GB '
      f'of arrays; this analysis allows {MEMORY_LIMIT_GB:g} GB): {widest} has '
      f'{counts[widest]:,} levels; a factor is a setting with a few levels: drop it from '
      '--factors (or the interactions that multiply it)'
    )
  columns, by_factor = {'Intercept': np.ones(len(runs))}, {}
  for f in factors:
    by_factor[f] = [f'{f}={lv}' for lv in levels(runs, f) if lv != ref[f]]
    for name in by_factor[f]:
      columns[name] = (runs[f] == name.split('=', 1)[1]).to_numpy(float)
  for a, b in interactions:
    for ca in by_factor[a]:
      for cb in by_factor[b]:
        if (columns[ca] * columns[cb]).any():
          columns[f'{ca}:{cb}'] = columns[ca] * columns[cb]
  X = pd.DataFrame(columns, index=runs.index)
  r = np.abs(np.diag(np.linalg.qr(np.unique(X.to_numpy(), axis=0), mode='r')))
  small = np.flatnonzero(r <= r.max() * max(X.shape) * np.finfo(float).eps)
  if small.size or len(r) < X.shape[1]:
    name = X.columns[small[0] if small.size else len(r)]
    raise ValueError(
      f'--factors: term {name} is confounded with the terms before it '
      '(no run separates them); drop one of those factors or interactions'
    )
  return X


def ols(y, X, cov, groups=None, note=''):
  """OLS with HC3 or seed-clustered standard errors, t intervals."""
  kwds = {'groups': pd.factorize(groups)[0]} if cov == 'cluster' else {}
  res = sm.OLS(y, X).fit(cov_type=cov, cov_kwds=kwds or None, use_t=True)
  what = (
    'OLS, standard errors clustered by seed (t, seeds - 1 df)'
    if cov == 'cluster'
    else 'OLS with HC3 standard errors (t, residual df)'
  )
  if not np.all(np.isfinite(res.bse)):
    raise ValueError(
      f'--factors: {what.split(",")[0]} gives no finite standard error here (a '
      'coefficient rests on single runs); add runs (seeds) or drop factors'
    )
  return {'result': res, 'kind': cov, 'method': f'{what}; {note}'}


def seed_fixed_effects(y, X, seeds, note):
  """OLS with one fixed effect per seed by the within transformation (Frisch-Waugh-Lovell)."""
  groups = pd.factorize(seeds)[0]

  def demean(v):
    return v - v.groupby(groups).transform('mean')

  within = demean(X.drop(columns='Intercept'))
  if not within.shape[1] or np.linalg.matrix_rank(within.to_numpy()) < within.shape[1]:
    return ols(
      y, X, 'cluster', seeds, note + '; seed fixed effects left out: confounded with factors'
    )
  res = sm.OLS(demean(y), within).fit(cov_type='cluster', cov_kwds={'groups': groups}, use_t=True)
  return {
    'result': res,
    'kind': 'within',
    'method': (
      "OLS with seed fixed effects (within transformation: each seed's mean removed), standard "
      'errors clustered by seed (CR1, the seed effects not counted in K; t, seeds - 1 df); ' + note
    ),
  }


def mixed(y, X, seeds):
  """(MixedLM model, '') or (None, why it failed: an exception, no convergence)."""
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      res = sm.MixedLM(y, X, groups=seeds).fit(reml=True)
    bad = sorted({str(w.message) for w in caught if any(k in str(w.message) for k in FAILED_FIT)})
    if not res.converged:
      bad.append('did not converge')
    if not np.all(np.isfinite(res.bse_fe)):
      bad.append('non-finite standard errors')
    why = '; '.join(bad)
  except Exception as e:  # any failure of the mixed fit means the fallback, said in `method`
    why = f'{type(e).__name__}: {e}'
  if why:
    return None, why
  return {
    'result': res,
    'kind': 'mixed',
    'method': f'MixedLM (REML), random intercept per seed '
    f'({seeds.nunique()} seeds, seed sd {np.sqrt(res.cov_re.iloc[0, 0]):.3g}); 95% Wald '
    '(normal) intervals',
  }, ''


def fit(y, X, seeds):
  """The model the size and the data allow (module doc): {'result', 'kind', 'method'}."""
  n, k = X.shape
  if n <= k:
    raise ValueError(
      f'--factors: {n} usable runs for {k} coefficients (intercept and factor '
      'levels) leave no residual to estimate the error from; add runs (seeds) or '
      'drop factors'
    )
  if seeds is None:
    return ols(y, X, 'HC3', note='no seed column, so runs are taken as independent')
  if seeds.nunique() < 2:
    return ols(y, X, 'HC3', note='one seed, so its effect is the intercept')
  if seeds.value_counts().max() < 2:
    return ols(y, X, 'HC3', note='one run per seed, so seed effects cannot be separated')
  if n > MIXED_MAX_ROWS:
    why = f'{n:,} runs > {MIXED_MAX_ROWS:,} (its fit loops over the seeds; BENCHMARKS.md)'
    return seed_fixed_effects(y, X, seeds, f'MixedLM not fitted: {why}')
  model, why = mixed(y, X, seeds)
  return model or seed_fixed_effects(y, X, seeds, f'mixed fit failed ({why})')


def contrast(model, weights):
  """(Estimate, df) of sum(weights[col] * coef[col]) (statsmodels t_test)."""
  res = model['result']
  k = res.k_fe if model['kind'] == 'mixed' else len(res.params)
  names = list(res.params.index[:k])
  L = np.zeros(k)
  for col, w in weights.items():
    if col in names:
      L[names.index(col)] += w
    elif w:  # the within fit has no intercept: only differences of cells are estimable
      raise ValueError(f'{col} is not estimable by {model["method"].split(";")[0]}')
  if not L.any():
    return Estimate(0.0, 0.0, 0.0, 0.0, np.nan), np.inf
  tt = res.t_test(L[None, :])
  low, high = np.ravel(tt.conf_int(alpha=0.05))
  effect, sd, p = (float(np.ravel(v)[0]) for v in (tt.effect, tt.sd, tt.pvalue))
  estimate = Estimate(effect, sd, float(low), float(high), p)
  return estimate, float(getattr(tt, 'df_denom', None) or np.inf)


def contrast_row(model, weights):
  """contrast as the columns of a CSV table: estimate, se, ci_low, ci_high, p, df."""
  estimate, df = contrast(model, weights)
  return {**estimate._asdict(), 'df': df}


def arm_rows(model, X, runs, factors, ref):
  """Each observed arm (combination of factor levels) minus the reference arm, from the model."""
  keys = list(zip(*(runs[f] for f in factors), strict=True))
  index = {}
  codes = [index.setdefault(key, len(index)) for key in keys]
  means = X.groupby(codes).mean()  # each arm's row of the design (its runs' mean)
  base = tuple(ref[f] for f in factors)
  rows = []
  for key in sorted(set(index) - {base}):
    w = means.loc[index[key]].copy()
    w['Intercept'] -= 1.0
    arm = ', '.join(f'{f}={v}' for f, v in zip(factors, key, strict=True))
    rows.append({'arm': arm, **contrast_row(model, w)})
  return pd.DataFrame(rows, columns=['arm'] + CSV_COLUMNS[1:] + ['se', 'df'])


def select(frame, metric, factors, seed_col):
  """(stats.Prepared of the usable runs, {factor: column}, whether there is a seed column)."""
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  if not factors:
    raise ValueError('--factors: give at least one factor column, e.g. --factors platform profile')
  cols = {f: resolve_column(frame, f, '--factors') for f in factors}
  metric_col = resolve_column(frame, metric, '--metric')
  try:
    seed_col, has_seed = resolve_column(frame, seed_col, '--seed-col'), True
  except ValueError:
    if seed_col != 'seed':
      raise
    seed_col, has_seed = None, False
  # one copy, of the columns the attribution reads (an export has ~100 more)
  needed = {'run', 'status', 'reason', 'platform', 'device_kind', record.DETERMINISM_COLUMN}
  needed.add(inputs.RECORDED_PLATFORM)
  needed |= {metric_col, seed_col, *cols.values(), *rules.arm_columns(frame)}
  needed |= set(rules.pairing_columns(frame.columns))
  frame = frame[[c for c in frame.columns if c in needed]].copy()
  values = pd.to_numeric(frame[metric_col], errors='coerce')
  frame[metric_col] = values.where(np.isfinite(values))
  if not has_seed:
    frame['_row'], seed_col = np.arange(len(frame)), '_row'
  arm = list(dict.fromkeys(list(cols.values()) + rules.arm_columns(frame)))
  prep = stats.prepare(frame, arm, metric_col, seed_col)  # a seed counts once per arm
  runs, excluded = prep.runs, prep.excluded
  absent = runs[list(cols.values())].isna()
  missing = absent.any(axis=1)
  if missing.any():
    why = [f'no value for {", ".join(absent.columns[row])}' for row in absent[missing].to_numpy()]
    more = pd.DataFrame({'run': runs.loc[missing, 'run'], 'status': 'completed', 'reason': why})
    excluded = pd.concat([excluded, more])
    runs = runs[~missing]
  for name, col in cols.items():  # 0 stays '0' when a failed run left the column's cell empty
    runs[name] = inputs.whole_numbers(runs[col]).astype(str)
  prep = dataclasses.replace(
    prep, runs=runs.reset_index(drop=True), excluded=excluded.reset_index(drop=True)
  )
  return prep, cols, has_seed


def references(runs, columns, given):
  """{factor: reference level}: given, else the first sorted level (platform too)."""
  chosen = {find_factor(k, columns, '--reference'): v for k, v in given.items()}
  out = {}
  for factor in columns:
    lv = levels(runs, factor)
    out[factor] = chosen.get(factor, lv[0])
    if out[factor] not in lv:
      raise ValueError(
        f'--reference: {factor} has no level {out[factor]!r}; levels: {", ".join(lv)}'
      )
  return out


def factor_attribution(
  frame,
  factors,
  metric=stats.DEFAULT_METRIC,
  seed_col='seed',
  reference=None,
  interactions=(),
  margin=None,
  noise_arm=None,
  native=None,
  platform_profile=None,
  source='',
  margin_reason=None,
  noise_of=None,
  min_share=None,
  compare=None,
  compare_flag='compare',
  device_kinds='split',
):
  """The whole attribution as an Attribution."""
  if margin is not None and not margin > 0:
    raise ValueError(f"--margin: must be a positive number in the metric's units, got {margin}")
  if problem := declaration.device_kinds_problem(device_kinds):
    raise ValueError(f'--device-kinds: {problem}')
  prep, columns, has_seed = select(frame, metric, list(factors), seed_col)
  runs = prep.runs
  ref = references(runs, columns, parse_pairs(reference, '--reference'))
  pairs = []
  for item in interactions or ():
    a, colon, b = str(item).partition(':')
    if not colon:
      raise ValueError(
        f'--interactions: {item!r} is not A:B; write e.g. --interactions platform:profile'
      )
    pairs.append(tuple(find_factor(f, columns, '--interactions') for f in (a, b)))
  X = design(runs, list(columns), ref, pairs)
  model = fit(runs['value'], X, runs['seed'] if has_seed else None)
  unit = 'pp' if prep.scale == 100 else 'metric units'
  formula = [f"C({f}, Treatment('{ref[f]}'))" for f in columns] + [f'{a}:{b}' for a, b in pairs]
  terms = [{'term': c, **contrast_row(model, {c: 1.0})} for c in X.columns if c != 'Intercept']
  seeded = runs if has_seed else runs.drop(columns='seed')
  given = (native, platform_profile, margin, min_share, compare, compare_flag, device_kinds)
  section = gap_section(seeded, columns, ref, *given)
  noise = stats.noise_floors(
    runs,
    parse_pairs(noise_arm, '--noise-arm'),
    parse_pairs(noise_of or reference or {}, '--noise-of'),
    list(columns),
  )
  return Attribution(
    metric=prep.metric,
    source=source,
    reference=ref,
    margin=margin,
    margin_reason=margin_reason,
    unit=unit,
    model=f'{prep.metric} ~ ' + ' + '.join(formula) + (' + (1 | seed)' if has_seed else ''),
    method=model['method'],
    terms=pd.DataFrame(terms, columns=CSV_COLUMNS + ['se', 'df']),
    n_runs=len(runs),
    excluded=prep.excluded,
    replicates=prep.replicates,
    noise=noise,
    min_share=min_share,
    compare_flag=compare_flag if compare else None,
    arms=None if section['gap'] is not None else arm_rows(model, X, runs, list(columns), ref),
    device_kinds=device_kinds,
    **section,
  )


def cross_check(runs, factor, others, ref, summary, native):
  """The CrossCheck of a gap: a MixedLM over its cells and seeds, the estimate's weights."""
  a, b = summary.platforms
  keep = runs['seed'].isin(summary.seeds) & at_reference(runs, others, ref)
  sub = runs[keep].assign(cell=lambda r: r['platform'].astype(str) + '|' + r[factor].astype(str))
  cells_run = set(sub['cell'])
  X = design(sub, ['cell'], {'cell': f'{b}|{native}'})
  try:
    model = fit(sub['value'], X, sub['seed'])
  except (ValueError, np.linalg.LinAlgError):
    return CrossCheck()
  contrasts, notes = {}, {}
  for key, weights in summary.weights.items():
    if key not in summary.values:
      continue
    absent = [f'{e} on {p}' for (p, e), v in weights.items() if v and f'{p}|{e}' not in cells_run]
    if absent:  # the estimate's definition needs a cell the fit has no coefficient for
      notes[key] = 'cannot use the same definition: no runs of ' + ', '.join(absent)
      continue
    w = pd.Series(
      {f'cell={p}|{e}': v for (p, e), v in weights.items() if f'cell={p}|{e}' in X}, dtype=float
    )
    contrasts[key] = contrast(model, w)[0]
  return CrossCheck(model['method'], contrasts, notes)


def native_arm(runs, columns, given):
  """(factor, level) of the native arm: --native, else a 'profile' factor with a 'native' level."""
  if given:
    ((name, level),) = given.items() if len(given) == 1 else [(None, None)]
    if name is None:
      raise ValueError('--native: give one factor=level, e.g. --native profile=native')
    factor = find_factor(name, columns, '--native')
    if level not in set(runs[factor]):
      raise ValueError(
        f'--native: {factor} has no level {level!r}; levels: {", ".join(levels(runs, factor))}'
      )
    return factor, level
  for factor, col in columns.items():
    if col.rsplit('.', 1)[-1] == 'profile' and 'native' in set(runs[factor]):
      return factor, 'native'
  return None


def decompose(runs, columns, ref, native, given_map, pairs, blocks=None):
  """([GapSummary per pair, with its cross-check], emulation map, notes, [KindEffect]); `blocks`:
  kind_blocks' platforms, each a cell of its kinds' per-seed mean (block_cells)."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  needed = sorted({p for pair in pairs for p in pair})
  emu = default_emulation(runs, nf, needed, given_map)
  others = [f for f in columns if f not in (nf, plat)]
  blocks = blocks or {}
  kinds = cell_means(runs, nf, others, ref)
  cells, effects = block_cells(kinds, blocks), kind_effects(kinds, blocks, nl)
  pooled = pooled_names(blocks)
  runs = runs.assign(platform=runs['platform'].map(lambda p: pooled.get(p, p)))
  levels = {*emu.values(), nl}
  where = {(p, e): missing_kinds(kinds, ks, p, e) for p, ks in blocks.items() for e in levels}
  summaries, notes = [], []
  for a, b in pairs:
    absent = [where.get((p, nl), p) for p in (a, b) if (p, nl) not in cells]
    if absent:
      notes.append(
        f"{a} − {b}: no {nf}={nl} run on {', '.join(absent)} at the other factors' reference levels"
      )
      continue
    summary = components(cells, a, b, nl, emu, where)
    if len(summary.seeds) < 2:
      notes.append(f'{a} − {b}: fewer than 2 seeds ran every cell of the gap')
      continue
    check = cross_check(runs, nf, others, ref, summary, nl)
    summaries.append(dataclasses.replace(summary, cross_check=check))
  if not summaries:
    raise LookupError('; '.join(notes) or 'no platform pair to compare')
  return summaries, {p: emu[p] for p in needed}, notes, effects


def gap_section(
  runs, columns, ref, native, platform_profile, margin, min_share, compare, flag, device_kinds
):
  """The Attribution's gap fields (gap, gap_note, native, emulation, decomposition)."""
  platforms = sorted(set(runs['platform'].astype(str))) if 'platform' in runs else []
  blocks = kind_blocks(runs) if device_kinds == 'blocked' else {}
  pooled = pooled_names(blocks)  # each blocked platform one, its device kinds pooled as blocks
  platforms = sorted({pooled.get(p, p) for p in platforms})

  def none(note):
    return {'gap': None, 'gap_note': note}

  if len(platforms) < 2:
    return none(
      f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
      'platform gap; each arm minus the reference arm instead'
    )
  pairs, left_out = platform_pairs(platforms, compare, flag)
  if 'seed' not in runs or runs['seed'].isna().all():
    return none('gap decomposition unavailable: no seed column, so no arm pairs with another')
  arm = native_arm(runs, columns, parse_pairs(native, '--native'))
  if arm is None:
    return none(
      'gap decomposition unavailable: no native arm (give --native factor=level); '
      'each arm minus the reference arm instead'
    )
  given = parse_pairs(platform_profile, '--platform-profile')
  every = set(platforms) | set(pooled)
  bad = {p for p in given if p not in every and not resolve_platform(p, sorted(every))}
  for p in every - set(given):  # 'gpu' names each of its device kinds' platforms too
    given.update({p: given[rules.jax_platform(p)]} if rules.jax_platform(p) in given else {})
  if bad:
    raise ValueError(
      f'--platform-profile: no runs on {", ".join(sorted(bad))}; platforms: {", ".join(platforms)}'
    )
  try:
    if not pairs:
      raise LookupError('none of the declared platform pairs ran (' + '; '.join(left_out) + ')')
    summaries, emu, notes, effects = decompose(
      runs.assign(platform=runs['platform'].astype(str)), columns, ref, arm, given, pairs, blocks
    )
  except LookupError as e:
    return none(
      f'gap decomposition unavailable: {e.args[0]}; each arm minus the reference arm instead'
    )
  tables = [component_table(s, margin) for s in summaries]
  judged = judge_family(summaries, tables, margin, min_share)
  note = '; '.join(left_out + notes)
  out = dict(native=arm, emulation=emu, gap_summaries=summaries, pairs_note=note)
  out['kind_effects'] = effects
  return {**out, 'gap': pd.concat(tables, ignore_index=True), 'decomposition': judged}


def platform_profile(runs, declared):
  """The declared {platform: profile} of the platforms run ('cpu-AVX2' takes cpu's)."""
  present = set(runs['platform'].astype(str)) if 'platform' in runs else set()
  given = parse_pairs(declared or {}, '--platform-profile')
  return {
    p: given.get(p, given.get(rules.jax_platform(p)))
    for p in sorted(present)
    if p in given or rules.jax_platform(p) in given
  }


def declared_attribution(frame, declared, metric, seed_col, margin, margin_reason, source, compare):
  """The attribution with the declared factors, arms and platform pairs (`compare`: --compare's)."""
  completed = frame[stats.run_status(frame) == 'completed']
  out = factor_attribution(
    frame,
    declared['factors'],  # study_analysis attributes a declared study only
    metric=metric,
    seed_col=seed_col or 'seed',
    reference=declared.get('reference'),
    margin=margin,
    noise_arm=declared.get('noise_arm'),
    noise_of=declared.get('noise_of'),
    min_share=declared.get('min_share'),
    native=declared.get('native'),
    platform_profile=platform_profile(completed, declared.get('platform_profile')),
    source=source,
    margin_reason=margin_reason,
    compare=compare or declared.get('compare'),
    compare_flag='--compare' if compare else 'compare',
    device_kinds=declared.get('device_kinds') or 'split',
  )
  labels = {}  # {term: short label}: 'profile=tpu_default' -> 'tpu_default'
  for term in out.terms['term']:
    factor, _, level = term.partition('=')
    labels[term] = (
      f'platform {level}'
      if factor == 'platform'
      else declaration.factor_label(declared, factor, level)
      if level and ':' not in term
      else term
    )
  return dataclasses.replace(out, labels=labels)


def check_compare(frame, compare, declares, flag='--compare', device_kinds='split'):
  """Refuse, before any statistic, compare pairs naming a platform without completed runs (a
  device kind's platform where the kinds are blocked: its pairs are the pooled platform's)."""
  if not declares and flag == '--compare':
    raise ValueError(
      '--compare: the platform gap is decomposed only for a declared study (factors, '
      "reference and native arm: the root's study.json, or --study)"
    )
  done = frame[stats.run_status(frame) == 'completed']
  present = sorted(set(done['platform'].astype(str))) if 'platform' in done else []
  blocks = kind_blocks(done) if device_kinds == 'blocked' else {}
  pooled = pooled_names(blocks)
  platform_pairs(sorted({pooled.get(p, p) for p in present}), compare, flag)


def tables(att):
  """{file name: table} of the attribution `att`'s CSV files (None: not written)."""
  flat = pd.DataFrame([d.row() for d in att.decomposition]) if att and att.decomposition else None
  return {
    'attribution.csv': att.terms[CSV_COLUMNS] if att else None,
    'attribution_gap.csv': att.gap if att else None,
    'attribution_decomposition.csv': flat,
  }
