"""Which numerical setting explains a difference: factor effects from a seed mixed model, and each
platform pair's native gap split into a numerics part and a residual (docs/statistics.md)."""

import dataclasses
import warnings
from typing import Any, Optional

import numpy as np
import pandas as pd
import statsmodels.api as sm

from analysis import declaration, gap, inputs, stats
from analysis.declaration import resolve_column
from analysis.gap import Decomposition, GapSummary
from runrecord import record, rules

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
    return seed_fixed_effects(
      y,
      X,
      seeds,
      (
        f'MixedLM not fitted: {n:,} runs > {MIXED_MAX_ROWS:,} (its fit loops over the seeds; '
        'BENCHMARKS.md)'
      ),
    )
  model, why = mixed(y, X, seeds)
  return model or seed_fixed_effects(y, X, seeds, f'mixed fit failed ({why})')


def contrast(model, weights):
  """(gap.Estimate, df) of sum(weights[col] * coef[col]) (statsmodels t_test)."""
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
    return gap.Estimate(0.0, 0.0, 0.0, 0.0, np.nan), np.inf
  tt = res.t_test(L[None, :])
  low, high = np.ravel(tt.conf_int(alpha=0.05))
  effect, sd, p = (float(np.ravel(v)[0]) for v in (tt.effect, tt.sd, tt.pvalue))
  estimate = gap.Estimate(effect, sd, float(low), float(high), p)
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
    excluded = pd.concat(
      [
        excluded,
        pd.DataFrame({'run': runs.loc[missing, 'run'], 'status': 'completed', 'reason': why}),
      ]
    )
    runs = runs[~missing]
  for name, col in cols.items():  # 0 stays '0' when a failed run left the column's cell empty
    runs[name] = inputs.whole_numbers(runs[col]).astype(str)
  return (
    dataclasses.replace(
      prep, runs=runs.reset_index(drop=True), excluded=excluded.reset_index(drop=True)
    ),
    cols,
    has_seed,
  )


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
):
  """The whole attribution as an Attribution."""
  if margin is not None and not margin > 0:
    raise ValueError(f"--margin: must be a positive number in the metric's units, got {margin}")
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
  given = (native, platform_profile, margin, min_share, compare, compare_flag)
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
    **section,
  )


def cross_check(runs, factor, others, ref, summary, native):
  """The gap.CrossCheck of a gap: a MixedLM over its cells and seeds, the estimate's weights."""
  a, b = summary.platforms
  keep = runs['seed'].isin(summary.seeds) & gap.at_reference(runs, others, ref)
  sub = runs[keep].assign(cell=lambda r: r['platform'].astype(str) + '|' + r[factor].astype(str))
  cells_run = set(sub['cell'])
  X = design(sub, ['cell'], {'cell': f'{b}|{native}'})
  try:
    model = fit(sub['value'], X, sub['seed'])
  except (ValueError, np.linalg.LinAlgError):
    return gap.CrossCheck()
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
  return gap.CrossCheck(model['method'], contrasts, notes)


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


def decompose(runs, columns, ref, native, given_map, pairs):
  """([gap.GapSummary per pair, with its cross-check], emulation map, notes)."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  needed = sorted({p for pair in pairs for p in pair})
  emu = gap.default_emulation(runs, nf, needed, given_map)
  others = [f for f in columns if f not in (nf, plat)]
  cells = gap.cell_means(runs, nf, others, ref)
  summaries, notes = [], []
  for a, b in pairs:
    absent = [p for p in (a, b) if (p, nl) not in cells]
    if absent:
      notes.append(
        f"{a} − {b}: no {nf}={nl} run on {', '.join(absent)} at the other factors' reference levels"
      )
      continue
    summary = gap.components(cells, a, b, nl, emu)
    if len(summary.seeds) < 2:
      notes.append(f'{a} − {b}: fewer than 2 seeds ran every cell of the gap')
      continue
    check = cross_check(runs, nf, others, ref, summary, nl)
    summaries.append(dataclasses.replace(summary, cross_check=check))
  if not summaries:
    raise LookupError('; '.join(notes) or 'no platform pair to compare')
  return summaries, {p: emu[p] for p in needed}, notes


def gap_section(
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
  """The Attribution's gap fields (gap, gap_note, native, emulation, decomposition)."""
  platforms = sorted(set(runs['platform'].astype(str))) if 'platform' in runs else []

  def none(note):
    return {'gap': None, 'gap_note': note}

  if len(platforms) < 2:
    return none(
      f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
      'platform gap; each arm minus the reference arm instead'
    )
  pairs, left_out = gap.platform_pairs(platforms, compare, compare_flag)
  if 'seed' not in runs or runs['seed'].isna().all():
    return none('gap decomposition unavailable: no seed column, so no arm pairs with another')
  arm = native_arm(runs, columns, parse_pairs(native, '--native'))
  if arm is None:
    return none(
      'gap decomposition unavailable: no native arm (give --native factor=level); '
      'each arm minus the reference arm instead'
    )
  given = parse_pairs(platform_profile, '--platform-profile')
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
  table, judged = gap.summarise(summaries, margin, min_share)
  note = '; '.join(left_out + notes)
  out = dict(gap=table, native=arm, emulation=emu, gap_summaries=summaries, pairs_note=note)
  return {**out, 'decomposition': judged}


def platform_profile(runs, declared):
  """The declared {platform: profile} of the platforms run ('cpu-AVX2' takes cpu's)."""
  present = set(runs['platform'].astype(str)) if 'platform' in runs else set()
  given = parse_pairs(declared or {}, '--platform-profile')
  return {
    p: given.get(p, given.get(rules.jax_platform(p)))
    for p in sorted(present)
    if p in given or rules.jax_platform(p) in given
  }


def declared_attribution(
  frame, declared, metric, seed_col, margin, margin_reason, source, compare=None
):
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


def check_compare(frame, compare, declares, flag='--compare'):
  """Refuse, before any statistic, compare pairs naming a platform without completed runs."""
  if not declares and flag == '--compare':
    raise ValueError(
      '--compare: the platform gap is decomposed only for a declared study (factors, '
      "reference and native arm: the root's study.json, or --study)"
    )
  done = frame[stats.run_status(frame) == 'completed']
  present = sorted(set(done['platform'].astype(str))) if 'platform' in done else []
  gap.platform_pairs(present, compare, flag)
