"""The study's answer as numbers: statistics per arm, the declared contrasts, the gap decomposition
and the platforms' software, from one runs table and the study's declaration.
analysis/words/report.py puts it into words, analysis/figures/study_figures.py draws it,
analysis/analyse.py is the command.

  result = study_analysis(frame, declaration.load('configs/digits.py:study'))

Without a declaration (or one without factors and a reference) every pair of arms is compared
instead of the declared contrasts, and there is no attribution.
Reference: docs/statistics.md.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import pandas as pd

from analysis import agreement, attribution, declaration, inputs, stats
from analysis.inputs import seed_text
from analysis.numbers import result
from runrecord import record, rules

VERSION_PREFIX = 'versions.'


def platform_profile(runs, declared):
  """The declared {platform: profile} for the platforms among the runs: a study's declaration
  lists every JAX platform it may run on (analysis.numbers.attribution rejects one without runs); a
  platform identity such as 'cpu-AVX2' (runrecord.rules.platform_identity) takes its JAX
  platform's profile."""
  present = set(runs['platform'].astype(str)) if 'platform' in runs else set()
  given = attribution.parse_pairs(declared or {}, '--platform-profile')
  return {
    p: given.get(p, given.get(rules.jax_platform(p)))
    for p in sorted(present)
    if p in given or rules.jax_platform(p) in given
  }


def distinct(values):
  """The distinct values of a column as text: one value, or 'a, b (differ between runs)'."""
  seen = sorted({str(v) for v in values.dropna()})
  if not seen:
    return None
  return seen[0] if len(seen) == 1 else ', '.join(seen) + ' (differ between runs)'


def software(runs):
  """analysis.numbers.result.Software of the analysed runs: each platform's device kind, CPU facts,
  device count and package versions, and the packages whose versions differ between platforms."""
  if 'platform' not in runs:
    return result.Software()
  packages = sorted(c[len(VERSION_PREFIX) :] for c in runs if c.startswith(VERSION_PREFIX))
  out = {}
  for platform, group in runs.groupby(runs['platform'].astype(str), sort=True):
    out[platform] = {
      'device_kind': distinct(group.get('device_kind', pd.Series(dtype=str))),
      **{f: distinct(group[f]) if f in group else None for f in record.CPU_FACTS},
      'devices': distinct(group.get('num_devices', pd.Series(dtype=str))),
      'versions': {p: distinct(group[VERSION_PREFIX + p]) for p in packages},
    }
  confounds = [
    p for p in packages if len({v['versions'][p] for v in out.values() if v['versions'][p]}) > 1
  ]
  return result.Software(platforms=out, confounds=confounds)


def term_labels(terms, declared):
  """{term: short label}: 'profile=tpu_default' -> 'tpu_default',
  'platform=gpu' -> 'platform gpu'."""
  out = {}
  for term in terms:
    factor, _, level = term.partition('=')
    out[term] = (
      f'platform {level}'
      if factor == 'platform'
      else declaration.factor_label(declared, factor, level)
      if level and ':' not in term
      else term
    )
  return out


def declared_attribution(
  frame, declared, metric, seed_col, margin, margin_reason, source, compare=None
):
  """analysis.numbers.attribution with the declared factors, reference, noise arm, native arm and
  platform pairs (`compare`, from --compare, overrides the declared ones)."""
  completed = frame[stats.run_status(frame) == 'completed']
  out = attribution.factor_attribution(
    frame,
    declared.get('factors') or attribution.default_factors(frame),
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
  return dataclasses.replace(out, labels=term_labels(out.terms['term'], declared))


def study_analysis(
  frame: pd.DataFrame,
  declared: Optional[dict[str, Any]] = None,
  group_by: Sequence[str] = (),
  metric: str = stats.DEFAULT_METRIC,
  margin: Optional[float] = None,
  margin_reason: Optional[str] = None,
  seed_col: Optional[str] = None,
  scale: Optional[float] = None,
  all_pairs: bool = False,
  source: str = '',
  read_predictions: Optional[Callable[[pd.DataFrame], list[inputs.Read]]] = None,
  compare: Optional[Sequence[Sequence[str]]] = None,
) -> result.Analysis:
  """The whole analysis of a study's runs table: every number its report, tables and figures show.

  Args:
    frame: the runs table, one row per run (analysis.inputs.results.load_study's, or
      analysis.inputs.csv_input.read_csv's).
    declared: the study's declaration (analysis/inputs/declaration.py; {} or None: none, and every
      pair of arms is compared, without attribution).
    group_by, metric, seed_col, scale: which columns make an arm, the compared metric, the seed
      column and the metric's factor to percent (stats.prepare; empty/None: the defaults).
    margin, margin_reason: the equivalence margin and why (None: the declared one).
    all_pairs: also test every pair of arms (`pairs`), apart from the declared contrasts.
    source: what the runs were read from, for the report.
    read_predictions: runs table -> [(predictions or None, why)] per row, for the agreement
      section (analysis.inputs.run_predictions.read_runs); None: no predictions (a CSV).
    compare: [[a, b], ...] (--compare): the platform pairs decomposed instead of the declared
      ones, an exploratory analysis.

  Returns:
    analysis.numbers.result.Analysis: stats.arms_and_pairs's Stats plus the declared contrasts,
    noise floors and attribution (declared_attribution), the software, the agreement, the scope
    and, for an exploratory analysis whose declared seeds are present, the confirmatory one.

  Raises:
    ValueError: bad input, one line naming the flag or field (before any statistic for
      --compare).
  """
  declared = declared or {}
  margin, why = stats.margin_choice(
    margin, margin_reason, declared.get('margin'), declared.get('margin_reason')
  )
  declares = bool(declared.get('factors') and declared.get('reference'))
  if compare:
    check_compare(frame, compare, declares)
  numbers = stats.arms_and_pairs(
    frame, group_by, metric, margin, why, seed_col, scale, all_pairs=all_pairs or not declares
  )
  out = result.Analysis(
    **stats.fields_of(numbers), declared=declared, source=source, software=software(numbers.runs)
  )
  if declares:
    out = dataclasses.replace(out, arm_info=stats.arm_levels(out, declared))
    out = dataclasses.replace(
      out,
      contrasts=stats.contrast_table(out, declared),
      noise=stats.noise_floors(
        out.runs,
        declared.get('noise_arm') or {},
        declared.get('noise_of') or declared.get('reference') or {},
        out.unit,
        list(stats.factor_columns(out.runs, declared).values()),
      ),
      attribution=declared_attribution(
        frame, declared, out.metric, seed_col, margin, why, source, compare
      ),
    )
  # Agreement between models: the run folders' saved predictions, read by `read_predictions`; a
  # CSV's rows are not run folders, so a CSV has none.
  out = dataclasses.replace(
    out, agreement=agreement.from_analysis(out, labels(out), read=read_predictions)
  )
  sc = scope(out, declared, compare)
  out = dataclasses.replace(out, scope=sc)
  if sc.confirmatory is False and sc.declared_seeds_present:
    seeds = pd.to_numeric(frame[seed_col or 'seed'], errors='coerce')
    confirmatory = study_analysis(
      frame[seeds.isin(sc.declared_seeds)],
      declared,
      group_by,
      metric,
      declared.get('margin'),
      None,
      seed_col,
      scale,
      all_pairs,
      source,
    )
    out = dataclasses.replace(out, confirmatory=confirmatory)
  return out


def pairs_text(pairs):
  """'tpu − gpu, gpu − cpu'."""
  return ', '.join(f'{a} − {b}' for a, b in pairs)


def check_compare(frame, compare, declares):
  """Refuse --compare pairs that name a platform without completed runs, or a study without the
  declaration the gap decomposition needs, before any statistic is computed."""
  if not declares:
    raise ValueError(
      '--compare: the platform gap is decomposed only for a declared study (factors, '
      "reference and native arm: the root's study.json, or --study)"
    )
  done = frame[stats.run_status(frame) == 'completed']
  present = sorted(set(done['platform'].astype(str))) if 'platform' in done else []
  attribution.platform_pairs(present, compare, '--compare')


def scope(out, declared, compare=None):
  """What was analysed against what was declared before the runs (analysis.numbers.result.Scope):
  declared_seeds (seeds 0..k-1 for a declared count k, as the study's get_sweep runs them, or the
  declared list; None undeclared), declared_margin, analysed_seeds, margin, declared_seeds_present,
  confirmatory (True: the declared seeds at the declared margin and platform pairs; False: more or
  other seeds, another margin, or platform pairs from --compare: an exploratory analysis; None:
  nothing declared), deviations (words)."""
  m0 = declared.get('margin')
  seeds = sorted({int(x) for x in out.runs['base_seed'].dropna()}) if out.seeded else []
  wanted = declaration.declared_seeds(declared)  # 0..k-1 for a count k, or the seeds listed
  deviations = []
  if wanted is not None and seeds != sorted(wanted):
    deviations.append(
      f'{len(seeds)} seeds analysed, {len(wanted)} declared (seeds {seed_text(pd.Series(wanted))})'
    )
  if m0 is not None and out.margin != m0:
    deviations.append(f'margin ±{out.margin:g}, declared ±{m0:g}')
  if compare:
    said = pairs_text(declared['compare']) if declared.get('compare') else 'every pair'
    deviations.append(f'platform pairs {pairs_text(compare)} from --compare (declared: {said})')
  known = wanted is not None or m0 is not None or bool(compare)
  return result.Scope(
    declared_seeds=wanted,
    declared_margin=m0,
    analysed_seeds=seeds,
    margin=out.margin,
    deviations=deviations,
    declared_seeds_present=bool(wanted)
    and set(wanted) <= set(seeds)
    and (set(wanted) != set(seeds) or m0 is not None or bool(compare)),
    confirmatory=(not deviations) if known else None,
  )


def labels(out):
  """{arm: short label} (the declaration's), or the arms' own labels without one."""
  if out.arm_info is not None:
    info = out.arm_info
    several = info['platform'].nunique() > 1
    return {r.arm: f'{r.platform}: {r.label}' if several else r.label for r in info.itertuples()}
  return {a: a for a in out.arms['arm']}
