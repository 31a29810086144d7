"""Per-arm summaries, pairwise tests and a verdict category per pair, from a runs table (Orbax
results through analysis.inputs.results, or a CSV): numbers only; analysis/words/report.py puts them
into words and analysis/analyse.py is the command (python -m analysis.analyse).

An arm is a set of runs with equal values in the group-by columns (default: runrecord.record's arm
columns: platform, device kind, every requested numerics field and every config field that differs
between the runs but those that cannot change a result: cadence, paths, distributed, the seed).
Labels name config fields as overrides spell them ('optim.learning_rate=0.002'); seeds print as
integers (analysis/inputs/labels.py). Runs of one arm are replicates when they are the same model
trained again: the same seed, init seed and data-order seed (the replicate rule,
runrecord.rules.model_keys: a root whose runs set init or data seeds apart from `seed` gets
'S (init I, data D)' units); replicates are averaged into one value per unit, their spread reported
as the arm's within-seed (nondeterminism) sd, and arms pair by equal units. Two
arms pair by seed when they share seeds and those runs share initial weights and data order (equal
runrecord.record pairing fields), whatever their determinism. A CSV without a seed column: every row
is its own run, unpaired. Runs that are not 'completed' are excluded and listed with their reason.
Accuracies stored as fractions are reported in percent, so differences and the margin are percentage
points (pp). Methods by size (Mann–Whitney, the arm's interval): analysis/numbers/inference.py.
Tables: analysis/figures/style.py.

Rank test and effect size by design: paired pairs get Wilcoxon's signed-rank test (exact at small
n, ties as midranks) and d_z = mean(d) / sd(d); unpaired pairs Mann–Whitney and Hedges' g.

Verdict of a pair (α = 0.05, p-values Holm-adjusted over the pairs judged together: all pairs, or
a study's declared contrasts, analysis/numbers/contrasts.py):
  identical arithmetic  the two arms ran on one platform with equal effective arithmetic (every
                IDENTICAL_FIELDS value of their records) and every paired difference is exactly
                0: reported, not tested, and outside the Holm family;
  within margin both below: a difference shown (as for "different") that lies within ±margin,
                what the gap verdict calls "gap within margin" (real and small);
  equivalent    the TOST p < α: the true difference lies within ±margin (and none is shown);
  different     the difference test (paired t when paired, else Welch) p < α and its 95% CI
                excludes 0; when the metric lives on a lattice (accuracy on N test images: steps
                of 100/N pp, `lattice`), the rank test's Holm p < α too, so a verdict cannot rest
                on a t-test over differences of one or two images;
  inconclusive  neither.
Reference: docs/statistics.md "Arms, seeds and replicates".
"""

import itertools

import numpy as np
import pandas as pd

from analysis import declaration
from analysis.declaration import resolve_column
from analysis.inputs import arm_labels, seed_key, seed_text, whole_numbers
from analysis.numbers import inference as inf
from analysis.numbers import result
from analysis.numbers.runs_table import (
  check_some_completed,
  lattice,
  model_units,
  replicate_table,
  run_deterministic,
  split_runs,
  unit_table,
)
from runrecord import record, rules

DEFAULT_METRIC = record.DEFAULT_METRIC
DEFAULT_MARGIN = declaration.DEFAULT_MARGIN
MAX_ARMS = 200  # 19,900 pairs: about 3 minutes of pairwise tests (10 ms a pair on a 2-core CPU)
EFFECTIVE = 'numerics.effective.'
IDENTICAL_FIELDS = (
  'platform',
  'device_kind',
  'batchnorm_group',
  'compute_dtype',
  'conv_format',
  'dense_format',
  'matmul_precision',
  'param_dtype',
  'xla_flags',
)
# A pair's verdicts, in the order the reports count them (judge).
VERDICTS = ('identical arithmetic', 'within margin', 'equivalent', 'different', 'inconclusive')
UNDECLARED = (
  'none declared: 0.5 pp is the analysis.numbers.stats default, not a study decision; '
  'declare one (--margin, --margin-reason)'
)


def prepare(frame, group_by, metric, seed_col=None, scale=None):
  """Split the runs into included / excluded, label each included run's arm, average replicates.

  `seed_col` None: 'seed' when the table has it, else every row is its own run (unpaired).
  Returns an analysis.numbers.result.Prepared: `runs` (included rows with `arm`, `value` = metric ×
  scale, `seed` (the model unit: model_units), `base_seed` (the seed column as recorded), `seeded`,
  `det`, `det_why`), `units` (one value per arm and seed), `replicates` (arm, seed, n_runs, runs,
  values, mean, range, identical), `excluded` (run, status, reason), `seeded`, `group_by`, `metric`,
  `scale`, `pairing` (the pairing fields the table records).
  """
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  check_some_completed(frame)
  metric = resolve_column(frame, metric, '--metric')
  group_by = [resolve_column(frame, g, '--group-by') for g in group_by] or rules.arm_columns(frame)
  seeded = seed_col is not None or 'seed' in frame.columns
  seed_col = resolve_column(frame, seed_col, '--seed-col') if seed_col else 'seed'
  runs, excluded, values = split_runs(frame, metric)
  if runs.empty:
    raise ValueError(
      f'--runs/--csv: none of the {len(frame)} runs is completed with a {metric}; '
      'see the excluded list'
    )
  if scale is None:
    scale = 100.0 if 'acc' in metric.lower() and values[runs.index].abs().max() <= 1 else 1.0
  runs['value'] = values[runs.index] * scale
  runs['base_seed'] = whole_numbers(runs[seed_col]) if seeded else None
  runs['seed'] = model_units(runs, seed_col) if seeded else None
  runs['seeded'] = seeded & runs['seed'].notna()
  runs['arm'] = arm_labels(runs, group_by)
  unknown = [None] * len(runs)
  det = [
    run_deterministic(p, v)
    for p, v in zip(
      runs.get('platform', unknown), runs.get(record.DETERMINISM_COLUMN, unknown), strict=True
    )
  ]
  runs['det'], runs['det_why'] = [d for d, _ in det], [w for _, w in det]
  seeded_runs = runs[runs['seeded']]
  return result.Prepared(
    runs=runs,
    units=unit_table(runs),
    replicates=replicate_table(seeded_runs),
    excluded=excluded,
    seeded=seeded,
    group_by=group_by,
    metric=metric,
    scale=scale,
    pairing=rules.pairing_columns(frame.columns),
    lattice=lattice(runs, metric, scale),
  )


def identical_arithmetic(prep, arm_a, arm_b):
  """Do the two arms' records give the same effective arithmetic (IDENTICAL_FIELDS of
  numerics.effective.*, one value per arm, all recorded)?"""
  runs = prep.runs
  cols = [EFFECTIVE + f for f in IDENTICAL_FIELDS]
  if not all(c in runs for c in cols[:2]):
    return False
  cols = [c for c in cols if c in runs]
  values = [
    runs.loc[runs['arm'] == arm, cols].astype(str).drop_duplicates() for arm in (arm_a, arm_b)
  ]
  return all(len(v) == 1 for v in values) and values[0].iloc[0].equals(values[1].iloc[0])


def determinism(runs, reps):
  """(True/False/None, why) for one arm: recorded determinism, contradicted by unequal
  replicates."""
  clash = reps[~reps['identical'].astype(bool)]
  if not clash.empty:
    return False, f'seed {clash["seed"].iloc[0]} repeated with a different value'
  known = [d for d in runs['det'] if d is not None]
  why = '; '.join(sorted(set(runs['det_why'])))
  if len(known) < len(runs):
    return None, why + ('; repeated seeds gave identical values' if not reps.empty else '')
  return all(known), why


def arm_table(prep):
  """Raises (naming --group-by) beyond MAX_ARMS arms, before any per-arm work. One row per arm: arm,
  group fields, n (seeds, or runs when unseeded), n_runs, mean, sd (between seeds), ci_low, ci_high,
  ci_method (95%), within_sd and within_df (replicates of a seed: the nondeterminism sd),
  deterministic (True/False/None), determinism (why), seeds."""
  arms = prep.units['arm'].nunique()
  if arms > MAX_ARMS:
    by = ', '.join(rules.field_name(g) for g in prep.group_by)
    raise ValueError(
      f'--group-by: {arms:,} arms (by {by}), more than this report holds '
      f'({MAX_ARMS} arms at most: up to {MAX_ARMS * (MAX_ARMS - 1) // 2:,} pairs of '
      'tests, minutes); group by fewer or coarser columns'
    )
  rows = []
  for arm, units in prep.units.groupby('arm', sort=True):
    runs = prep.runs[prep.runs['arm'] == arm]
    reps = prep.replicates[prep.replicates['arm'] == arm]
    x = units['value'].to_numpy()
    low, high, method = inf.mean_ci(x)
    seeded = runs[runs['seeded']]
    wsd, wdf = inf.within_sd(seeded['value'], seeded['seed'])
    det, why = determinism(runs, reps)
    rows.append(
      {
        'arm': arm,
        **{g: runs[g].iloc[0] for g in prep.group_by},
        'n': len(x),
        'n_runs': len(runs),
        'mean': x.mean(),
        'sd': x.std(ddof=1) if len(x) > 1 else np.nan,
        'ci_low': low,
        'ci_high': high,
        'ci_method': method,
        'within_sd': wsd,
        'within_df': wdf,
        'deterministic': det,
        'determinism': why,
        'seeds': seed_text(units['seed']),
      }
    )
  return pd.DataFrame(rows)


def design(prep, arm_a, arm_b):
  """(paired, shared seeds, why): pair by seed when the arms share seeds and those runs share
  initial weights and data order (equal pairing fields); determinism does not matter."""
  if not prep.seeded:
    return False, [], 'unpaired: no seed column, each row is its own run'
  units = prep.units
  seeds_a = set(units.loc[units['arm'] == arm_a, 'seed'].dropna())
  seeds_b = set(units.loc[units['arm'] == arm_b, 'seed'].dropna())
  shared = sorted(seeds_a & seeds_b, key=seed_key)
  if len(shared) < 2:
    return (
      False,
      shared,
      ('unpaired: no shared seeds' if not shared else 'unpaired: 1 shared seed, 2 needed'),
    )
  runs = prep.runs
  both = runs[runs['arm'].isin([arm_a, arm_b]) & runs['seed'].isin(shared)]
  values = both[prep.pairing].astype(str).groupby(both['seed']).nunique()
  differ = [c for c in prep.pairing if (values[c] > 1).any()]
  if differ:
    return False, shared, f'unpaired: pairing fields differ: {", ".join(differ)}'
  how = (
    'same init and data order'
    if prep.pairing
    else 'same seed taken as same init and data order (no pairing fields recorded)'
  )
  left = len(seeds_a | seeds_b) - len(shared)
  rest = f'; {left} unshared seed(s) left out of the paired tests' if left else ''
  return True, shared, f'paired: {len(shared)} shared seeds, {how}{rest}'


def values_by_seed(prep, arm, seeds):
  units = prep.units[prep.units['arm'] == arm].set_index('seed')
  return units.loc[seeds, 'value'].to_numpy()


def compare(prep, arm_a, arm_b, margin):
  """Every test of one pair of arms (a dict of pair_table's columns, before Holm)."""
  units = prep.units
  a = units.loc[units['arm'] == arm_a, 'value'].to_numpy()
  b = units.loc[units['arm'] == arm_b, 'value'].to_numpy()
  is_paired, shared, why = design(prep, arm_a, arm_b)
  t, df, p = inf.welch(a, b)
  row = {
    'arm_a': arm_a,
    'arm_b': arm_b,
    'n_a': len(a),
    'n_b': len(b),
    'paired': is_paired,
    'design': why,
    'n_pairs': len(shared) if is_paired else 0,
    'welch_t': t,
    'welch_df': df,
    'welch_p': p,
    'paired_t': np.nan,
    'paired_p': np.nan,
    'mw_u': np.nan,
    'mw_p': np.nan,
    'mw_method': 'not used (paired)',
    'signed_rank_w': np.nan,
    'signed_rank_p': np.nan,
    'signed_rank_method': 'not used (unpaired)',
    'hedges_g': np.nan,
    'd_z': np.nan,
    'identical': False,
  }
  if is_paired:
    xa, xb = values_by_seed(prep, arm_a, shared), values_by_seed(prep, arm_b, shared)
    d, n = xa - xb, len(shared)
    row['paired_t'], df, row['paired_p'] = inf.paired(xa, xb)
    row['signed_rank_w'], row['signed_rank_p'], row['signed_rank_method'] = inf.signed_rank(d)
    row.update(
      rank_test='signed-rank',
      rank_p=row['signed_rank_p'],
      d_z=inf.d_z(d),
      identical=bool(np.all(d == 0)) and identical_arithmetic(prep, arm_a, arm_b),
    )
    sd = np.std(d, ddof=1)
    se = sd / np.sqrt(n)
    row.update(diff=d.mean(), test='paired t', test_p=row['paired_p'], power_from=f'{n} pairs')
  else:
    row['mw_u'], row['mw_p'], row['mw_method'] = inf.mann_whitney(a, b)
    row.update(rank_test='Mann–Whitney', rank_p=row['mw_p'], hedges_g=inf.hedges_g(a, b))
    se, df = inf.welch_se_df(a, b)
    sd = np.sqrt(
      ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    )
    n = min(len(a), len(b))
    what = 'seeds' if prep.seeded else 'runs'
    row.update(
      diff=a.mean() - b.mean(), test='Welch t', test_p=p, power_from=f'{len(a)} + {len(b)} {what}'
    )
  row['power_sd'], row['power_n'] = sd, n
  row['ci95_low'], row['ci95_high'] = inf.diff_ci(row['diff'], se, df, 1 - inf.ALPHA)
  row['ci90_low'], row['ci90_high'], row['tost_p'] = inf.tost(row['diff'], se, df, margin)
  row['power_diff'], row['power_equiv'] = inf.power_at(sd, margin, n, is_paired)
  row['n80_diff'], row['n80_equiv'] = inf.seeds_needed(sd, margin, is_paired)
  row['lattice'] = prep.lattice
  return row


def judge(rows):
  """The pair table of compare() rows judged as one family: Holm-adjusted p-values over its rows
  but the identical-arithmetic ones (`*_p_holm`; NaN for those), `equivalent_raw` (raw TOST
  p < α), `equivalent` (Holm TOST p < α), `different` (Holm primary-test p < α and 95% CI excluding
  0, and on a lattice the Holm rank-test p < α) and `verdict` (module doc: identical arithmetic,
  within margin, equivalent, different, inconclusive)."""
  pairs = pd.DataFrame(rows)
  if pairs.empty:
    return pairs
  tested = ~pairs['identical'].astype(bool)
  for test in ('welch', 'paired', 'tost', 'mw', 'signed_rank', 'rank', 'test'):
    pairs[f'{test}_p_holm'] = inf.holm(pairs[f'{test}_p'].where(tested))
  pairs['equivalent_raw'] = (pairs['tost_p'] < inf.ALPHA) & tested
  pairs['equivalent'] = pairs['tost_p_holm'] < inf.ALPHA
  on_lattice = pairs['lattice'].notna()
  pairs['different'] = (
    (pairs['test_p_holm'] < inf.ALPHA)
    & ((pairs['ci95_low'] > 0) | (pairs['ci95_high'] < 0))
    & (~on_lattice | (pairs['rank_p_holm'] < inf.ALPHA))
  )
  pairs['verdict'] = np.select(
    [~tested, pairs['equivalent'] & pairs['different'], pairs['equivalent'], pairs['different']],
    ['identical arithmetic', 'within margin', 'equivalent', 'different'],
    'inconclusive',
  )
  return pairs


def family_size(table):
  """The number of comparisons Holm adjusts over: the judged ones but identical arithmetic."""
  return int((table['verdict'] != 'identical arithmetic').sum()) if not table.empty else 0


def pair_table(prep, arms, margin):
  """One row per pair of arms with n >= 2 (arm_a before arm_b; diff = mean A − mean B, over the
  shared seeds when paired): Welch, paired t (when paired), TOST and 90% CI, the primary test
  (`test`: paired t when paired, else Welch) with its 95% CI, Mann–Whitney (`mw_method`: by
  size, analysis.numbers.inference), Hedges' g, power; judged as one family (judge)."""
  ok = arms.loc[arms['n'] >= 2, 'arm']
  return judge([compare(prep, a, b, margin) for a, b in itertools.combinations(ok, 2)])


def margin_choice(margin=None, reason=None, declared=None, declared_reason=None):
  """(margin, reason text): the study's declared margin unless `margin` (--margin) overrides it;
  the default with a note saying it is undeclared when neither is given. Each is checked where it
  came from (declaration.check_margin: a ValueError naming --margin or the study's
  margin)."""
  if margin is not None:
    margin = declaration.check_margin(margin, '--margin')
  if declared is not None:
    declared = declaration.check_margin(
      declared, "the study's declared margin (study.json or get_study(): margin)"
    )
  if margin is None and declared is None:
    return DEFAULT_MARGIN, UNDECLARED
  if margin is None or margin == declared:
    return declared, declared_reason or 'the study declares it without a reason'
  text = f'from --margin: {reason or "no reason given"}'
  if declared is not None:
    text += f'; the study declares {declared:g} pp: {declared_reason or "no reason given"}'
  return margin, text


def arms_and_pairs(
  frame,
  group_by=(),
  metric=DEFAULT_METRIC,
  margin=DEFAULT_MARGIN,
  margin_reason=None,
  seed_col=None,
  scale=None,
  all_pairs=True,
):
  """analysis.numbers.result.Stats: prepare()'s Prepared plus `arms`, `pairs` (every pair; empty
  unless `all_pairs`), `small` (arms n < 2), `margin`, `margin_reason` (None: 'no reason given') and
  `unit` of the values, differences and margin ('pp' for percent, else 'units')."""
  if not margin > 0:
    raise ValueError(f'--margin: must be a positive number of percentage points, got {margin}')
  prep = prepare(frame, list(group_by), metric, seed_col, scale)
  arms = arm_table(prep)
  return result.Stats(
    **result.fields_of(prep),
    arms=arms,
    pairs=pair_table(prep, arms, margin) if all_pairs else pd.DataFrame(),
    small=arms[arms['n'] < 2],
    margin=margin,
    margin_reason=margin_reason or 'no reason given',
    unit='pp' if prep.scale == 100 else 'units',
  )
