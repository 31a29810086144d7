"""Which numerical setting explains a difference in a metric: factor effects from a mixed model
over seeds, and the split of the native platform gap into a numerics part and a platform residual.

  out = run(frame, ['platform', 'profile'], margin=0.3, noise_arm={'profile': 'noise'})

The command is analysis/attribute.py (its Markdown words: analysis/words/attribution_text.py).

Model (analysis/numbers/effects.py). metric ~ factors [+ chosen interactions] + (1 | seed):
statsmodels MixedLM with a random intercept per seed up to effects.MIXED_MAX_ROWS runs; beyond that,
or when the mixed fit fails, OLS with seed fixed effects (within transformation) and seed-clustered
errors; HC3 errors without seed replication; the `method` line says which and why. A design too
large for memory is refused before any fit (effects.check_size). A term `factor=level` is the
difference from that factor's reference level with the other factors held fixed, with its 95% CI.
Accuracies stored as fractions are in percentage points (x100), as in analysis.numbers.stats. Only
completed runs with a finite metric are used; the others are listed.

Platform gap (analysis/numbers/gap.py). With runs from two or more platforms and a native arm, the
native gap G = A − B of each platform pair compared (the declaration's compare; default every pair,
tpu − gpu first) is measured per seed from the paired cell
means of the native and emulating arms (every other factor at its reference level) and split
exactly into the emulation's fidelity on each platform, the numerics part and the platforms under
the same emulated arithmetic, each with a t-interval over seeds; the verdict (analysis/
gap_verdict.py: no gap / gap within margin / explained by numerics / partly explained / not
explained / inconclusive), the share explained (Fieller) and the seeds a decisive answer needs.
The mixed model over the same cells is shown as a cross-check. With one platform (or no native
arm) each observed arm is compared with the reference arm instead, from the main fit.

Noise floor, per platform (noise_floors). The paired sd of (noise arm - the arm it perturbs, the
declaration's noise_of, else the reference arm) over the seeds both ran, and the 95% half-width
of a paired mean difference at that many seeds, t(0.975, n - 1) x sd / sqrt(n): how large a
paired difference the matched perturbation alone gives at this study's seeds.
Reference: docs/statistics.md "Attribution".
"""

import dataclasses

import numpy as np
import pandas as pd

from analysis import stats
from analysis.declaration import resolve_column
from analysis.numbers import effects, gap, result
from runrecord import record, rules


def select(frame, metric, factors, seed_col):
  """The usable runs (stats.prepare: completed, finite metric; repeated runs of a seed in one arm
  are kept as observations sharing the seed's intercept, an arm being equal factors and
  runrecord.rules.arm_columns: platform, device kind, every requested numerics field and every
  config field that differs between the runs) as (analysis.numbers.result.Prepared with one str
  column per factor name, {factor: column}, whether there is a seed column)."""
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
  needed = {
    'run',
    'status',
    'reason',
    'platform',
    'device_kind',
    record.DETERMINISM_COLUMN,
    metric_col,
    seed_col,
    *cols.values(),
    *rules.arm_columns(frame),
    *rules.pairing_columns(frame.columns),
  }
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
  for name, col in cols.items():
    runs[name] = runs[col].astype(str)
  return (
    dataclasses.replace(
      prep, runs=runs.reset_index(drop=True), excluded=excluded.reset_index(drop=True)
    ),
    cols,
    has_seed,
  )


def default_factors(frame):
  """platform, the numerics.requested.* fields and the arm-defining config fields that vary among
  the completed runs (by rules.field_name where that names the same column)."""
  done = frame[stats.run_status(frame) == 'completed']
  cols = [c for c in rules.arm_columns(done) if c != 'device_kind']
  cols = [c for c in cols if done[c].astype(str).nunique() > 1]
  short = rules.field_name
  return [short(c) if resolve_column(frame, short(c), '') == c else c for c in cols]


def references(runs, columns, given):
  """{factor: reference level}: given, else the first sorted level (platform too, so the order in
  which runs or roots are read does not change the reference: cpu before gpu before tpu)."""
  chosen = {effects.find_factor(k, columns, '--reference'): v for k, v in given.items()}
  out = {}
  for factor in columns:
    lv = effects.levels(runs, factor)
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
  """The whole attribution (see module doc) as an analysis.numbers.result.Attribution: terms (the
  CSV table), gap (component table or None), decomposition (one verdict dict per gap,
  analysis/numbers/gap_verdict.py), arms, noise ({platform: noise_floor}), model, method, excluded,
  replicates, labels ({term: short label} for the renderer and figures; empty here, a study's
  declaration fills it). `compare`: the platform pairs whose gap is decomposed ([[a, b], ...], the
  declaration's or --compare's, named by `compare_flag`; default every pair, analysis/numbers/
  gap.py default_pairs)."""
  if margin is not None and not margin > 0:
    raise ValueError(f"--margin: must be a positive number in the metric's units, got {margin}")
  prep, columns, has_seed = select(frame, metric, list(factors), seed_col)
  runs = prep.runs
  ref = references(runs, columns, effects.parse_pairs(reference, '--reference'))
  pairs = []
  for item in interactions or ():
    a, colon, b = str(item).partition(':')
    if not colon:
      raise ValueError(
        f'--interactions: {item!r} is not A:B; write e.g. --interactions platform:profile'
      )
    pairs.append(
      (
        effects.find_factor(a, columns, '--interactions'),
        effects.find_factor(b, columns, '--interactions'),
      )
    )
  X = effects.design(runs, list(columns), ref, pairs)
  y, seeds = runs['value'], runs['seed'] if has_seed else None
  model = effects.fit(y, X, seeds)
  unit = 'pp' if prep.scale == 100 else 'metric units'
  split = gap.section(
    runs if has_seed else runs.drop(columns='seed'),
    columns,
    ref,
    native,
    platform_profile,
    margin,
    min_share,
    compare,
    compare_flag,
  )
  out = result.Attribution(
    metric=prep.metric,
    source=source,
    reference=ref,
    margin=margin,
    margin_reason=margin_reason,
    unit=unit,
    model=effects.formula(prep.metric, list(columns), ref, pairs, has_seed),
    method=model['method'],
    terms=effects.term_table(model, X),
    n_runs=len(runs),
    excluded=prep.excluded,
    replicates=prep.replicates,
    noise=stats.noise_floors(
      runs,
      effects.parse_pairs(noise_arm, '--noise-arm'),
      effects.parse_pairs(noise_of or reference or {}, '--noise-of'),
      unit,
      list(columns),
    ),
    min_share=min_share,
    gap=split['table'],
    gap_note=split['note'],
    emulation=split['emulation'],
    native=split['native'],
    decomposition=split['decomposition'],
    gap_summaries=split['summaries'],
    pairs_note=split.get('pairs_note', ''),
    compare_flag=compare_flag if compare else None,
  )
  if out.gap is None:
    out.arms = effects.arm_rows(model, X, runs, list(columns), ref)
  return out
