"""Agreement between models: churn, the share of test examples two models predict differently, per
seed and then across seeds, read against its baselines (the churn ladder). Numbers only:
analysis/numbers/agreement_section.py gathers the predictions into entries, analysis/figures/
churn_ladder.py draws the table.

Predictions: runrecord/predictions.read_predictions's dict per run (test-set order): `predicted`
int32[n] (classification) or [n, 40] (the attributes task), `label`, `fingerprint`, `task`.

  churn(A, B)   = (1/n) Σ_i [ŷ_A(i) ≠ ŷ_B(i)]                   classification, over n images
                = (1/(40 n)) Σ_i Σ_k [ŷ_A(i, k) ≠ ŷ_B(i, k)]    attributes, over all n×40 bits

One definition of disagreement, used by every churn here and by the divergence tool
(experiments/divergence_measure.py): the share of predicted labels that differ, over images for a
classification task and over image × attribute labels for the 40-attribute task (not the share of
images with any attribute different, which saturates as attributes are added).

Units: `entries` is a list of dicts {run, arm, seed, platform, pred, init, data} (pred: the
predictions dict; seed: the run's model, runrecord.rules.model_keys; init, data: its recorded init
and data-order seeds, None when not recorded); the entries of one arm and seed are its replicates.
Per seed s a pair gets one value c_s (its replicates' cross pairs averaged); over the m seeds the
row reports the mean c̄ = (1/m) Σ_s c_s with the t-Wilson interval over seeds
(analysis.numbers.inference.proportion_mean_ci: the μ with (c̄ − μ)² ≤ t²_{m−1} sd(c_s)² μ(1 − μ) /
(m c̄ (1 − c̄)); inside [0, 100] %, the t-interval c̄ ± t sd/√m away from the bounds): seeds are the
independent units, not images (a Wilson interval over the images of all seeds pooled ignores the
variation between seeds and comes out too narrow).

Kinds of rows (the ladder, bottom rung first; `pairing` says which seeds are compared):
  nondeterminism      same arm, same seed, replicate runs (same seed)
  identical           two arms of identical arithmetic, same seed: 0 by construction, checked
  noise               the noise arm vs the arm it perturbs, same seed (perturbation churn)
  contrast            a compared pair of arms (a declared contrast, or every pair), same seed
  platform            the same arm (or the native arms) on two platforms, same seed
  data order          one arm, same init seed, different data-order seeds (runs recording
                      `init` and `data`): per init seed, disjoint pairs of its sorted data seeds,
                      averaged; the t-interval is over the init seeds (different seeds)
  init                the same with the roles swapped: same data seed, different init seeds
  seed                one arm, two models that differ in both initial weights and data order
                      (different seeds; where init and data seeds are recorded apart, only pairs
                      whose init and data seeds both differ): disjoint pairs of its sorted models,
                      each model in one pair at most, so the pairs are independent
  seed_all            the seed rows of every arm of one platform pooled, clustered by seeds: arms
                      that share a seed pair share its initial weights and data order (two arms of
                      identical arithmetic give the same two models), so the pairs of all arms that
                      touch a common seed form one cluster, valued at their mean churn; the interval
                      is over the clusters, which share no seed (a = b = 'every arm on PLATFORM')
Reference: docs/statistics.md "Agreement between models".
"""

import collections
import itertools

import numpy as np
import pandas as pd

from analysis.inputs import seed_key
from analysis.numbers.agreement_reading import reading, rung, rung_text
from analysis.numbers.agreement_units import by_unit, disjoint_pairs, seed_row, seeds_of, unit_name

KINDS = (
  'nondeterminism',
  'identical',
  'noise',
  'contrast',
  'platform',
  'data order',
  'init',
  'seed',
  'seed_all',
)
SAME, DIFFERENT = 'same seed', 'different seeds'
DEFINITION = 'churn, the share of predicted test labels that differ'  # named so everywhere
CI_NAME = (
  '95% t-Wilson interval over seeds (the t-interval reshaped to stay inside [0, 100] %: '
  'analysis.numbers.inference.proportion_mean_ci)'
)
COLUMNS = (
  'kind',
  'a',
  'b',
  'platform_a',
  'platform_b',
  'pairing',
  'churn_pct',
  'ci_low',
  'ci_high',
  'seeds',
  'seed_list',
  'per_seed_pct',
  'unit',
  'check',
)


def churn(pred_a, pred_b):
  """Share of predictions that differ: mean of [ŷ_A ≠ ŷ_B] over every element (images, or
  images × attributes for the attributes task)."""
  a, b = np.asarray(pred_a), np.asarray(pred_b)
  if a.shape != b.shape:
    raise ValueError(f'predictions of shapes {a.shape} and {b.shape} cannot be compared')
  return float(np.mean(a != b))


def different_data(entry_a, entry_b):
  """Why two runs' predictions cannot be compared image by image: 'split fingerprint X vs Y' when
  their test splits differ (another data.split_seed: a legitimate arm of its own), 'task X vs Y'
  when their tasks do; None when they can."""
  pa, pb = entry_a['pred'], entry_b['pred']
  for field, name in (('fingerprint', 'split fingerprint'), ('task', 'task')):
    if pa[field] != pb[field]:
      return f'{name} {pa[field]} vs {pb[field]}'
  return None


def pair_churn(entry_a, entry_b):
  """churn between two runs' predictions; ValueError naming both runs when their test data
  (fingerprint) or task differ (the table leaves such pairs out first: churns)."""
  why = different_data(entry_a, entry_b)
  if why:
    raise ValueError(
      f'agreement: {entry_a["run"]} and {entry_b["run"]} predict different test '
      f'data ({why}); compare runs of one data set'
    )
  pa, pb = entry_a['pred'], entry_b['pred']
  return churn(pa['predicted'], pb['predicted'])


def churns(pairs, left_out):
  """The churn of each (entry, entry) pair whose test data agree; each other pair is left out:
  appended to `left_out` as {'a', 'b' (arms), 'run_a', 'run_b', 'why'} (different_data)."""
  values = []
  for x, y in pairs:
    why = different_data(x, y)
    if why:
      left_out.append(
        {'a': x['arm'], 'b': y['arm'], 'run_a': x['run'], 'run_b': y['run'], 'why': why}
      )
    else:
      values.append(pair_churn(x, y))
  return values


def cross_mean(left, right, left_out):
  """Mean churn over every (left, right) pair of replicate entries that share their test data
  (churns; the others appended to `left_out`); None when none does."""
  values = churns(itertools.product(left, right), left_out)
  return float(np.mean(values)) if values else None


def same_seed(units, kind, a, b, left_out):
  """Per shared seed s: c_s = churn(a's model, b's model) (replicates: their cross pairs
  averaged); the row of its mean over seeds, or None when the arms share no seed whose runs
  predict one test set (the others' pairs appended to `left_out`)."""
  shared = [s for s in seeds_of(units, a) if (b, s) in units]
  values = {s: cross_mean(units[(a, s)], units[(b, s)], left_out) for s in shared}
  shared = [s for s in shared if values[s] is not None]
  if not shared:
    return None
  return seed_row(
    kind,
    a,
    b,
    SAME,
    [values[s] for s in shared],
    shared,
    unit_name(units[(a, shared[0])][0]),
    units,
  )


def seed_churn(units, arm, left_out):
  """Churn between different seeds of one arm: disjoint_pairs (independent pairs, each differing
  in init and data order; a pair on two test sets appended to `left_out`); None without such a
  pair."""
  seeds = seeds_of(units, arm)
  values = {
    p: cross_mean(units[(arm, p[0])], units[(arm, p[1])], left_out)
    for p in disjoint_pairs(units, arm)
  }
  pairs = [p for p, v in values.items() if v is not None]
  if not pairs:
    return None
  values = [values[p] for p in pairs]
  labels = [f'{s}-{t}' for s, t in pairs]
  row = seed_row(
    'seed', arm, arm, DIFFERENT, values, labels, unit_name(units[(arm, seeds[0])][0]), units
  )
  return {**row, 'pairs': pairs}  # kept for clustering, not a column


def clusters(pairs):
  """[[index of the pairs in one cluster]]: pairs (of seeds, any arms) joined when they share a
  seed, transitively (union–find), so that different clusters share no seed."""
  parent = list(range(len(pairs)))

  def find(i):
    return i if parent[i] == i else find(parent[i])

  first = {}
  for i, pair in enumerate(pairs):
    for seed in pair:
      j = first.setdefault(seed, i)
      parent[find(i)] = find(j)
  groups = {}
  for i in range(len(pairs)):
    groups.setdefault(find(i), []).append(i)
  return list(groups.values())


def platform_seed_churn(seed_rows):
  """Per platform with >= 2 arms: one 'seed_all' row over the seed pairs of all its arms, clustered
  by seed (module doc): each cluster's value is the mean churn of its pairs, the row's mean and
  interval are over the clusters."""
  rows = []
  for platform in sorted({r['platform_a'] for r in seed_rows}):
    group = [r for r in seed_rows if r['platform_a'] == platform]
    if len(group) < 2:
      continue
    pairs = [p for r in group for p in r['pairs']]
    churns = [v for r in group for v in r['values']]
    found = clusters(pairs)
    values = [float(np.mean([churns[i] for i in c])) for c in found]
    name = f'every arm on {platform}'
    row = seed_row('seed_all', name, name, DIFFERENT, values, [], group[0]['unit'], {})
    rows.append(
      {
        **row,
        'platform_a': platform,
        'platform_b': platform,
        'seed_list': f'{len(churns)} pairs of {len(group)} arms in {len(values)} '
        'clusters of shared seeds',
      }
    )
  return rows


def source_churn(entries, arm, varied, fixed, left_out):
  """Churn from one source of one arm: runs equal in `fixed` ('init' or 'data'), different in
  `varied`; per level of `fixed`, the mean churn over disjoint pairs of its sorted `varied`
  levels (replicates: their cross pairs); the row over the levels of `fixed`. None without
  such pairs (or without recorded init and data seeds; pairs on two test sets: `left_out`)."""
  cells = {}
  for e in entries:
    if e['arm'] == arm and e.get('init') is not None and e.get('data') is not None:
      cells.setdefault(e[fixed], {}).setdefault(e[varied], []).append(e)
  values, labels = [], []
  for level in sorted(cells, key=seed_key):
    varied_levels = sorted(cells[level], key=seed_key)
    pairs = list(zip(varied_levels[0::2], varied_levels[1::2], strict=False))
    means = [cross_mean(cells[level][x], cells[level][y], left_out) for x, y in pairs]
    means = [m for m in means if m is not None]
    if means:
      values.append(np.mean(means))
      labels.append(level)
  if not values:
    return None
  kind = 'data order' if varied == 'data' else 'init'
  one = next(iter(next(iter(cells.values())).values()))[0]
  row = seed_row(kind, arm, arm, DIFFERENT, values, labels, unit_name(one), by_unit(entries))
  return {**row, 'seed_list': f'{fixed} seeds ' + row['seed_list']}


def replicate_churn(units, arm, left_out):
  """Churn between same-seed replicates of one arm: per seed with >= 2 runs, the mean churn over
  its replicate pairs (on one test set; others: `left_out`); None when no seed of the arm was
  repeated."""
  repeated = [s for s in seeds_of(units, arm) if len(units[(arm, s)]) > 1]
  values = {s: churns(itertools.combinations(units[(arm, s)], 2), left_out) for s in repeated}
  repeated = [s for s in repeated if values[s]]
  if not repeated:
    return None
  values = [np.mean(values[s]) for s in repeated]
  return seed_row(
    'nondeterminism',
    arm,
    arm,
    SAME,
    values,
    repeated,
    unit_name(units[(arm, repeated[0])][0]),
    units,
  )


def check_identical(row):
  """The identical-arithmetic row's check: every seed's churn exactly 0, as constructed."""
  zero = row['churn_pct'] == 0  # a mean of non-negative churns is 0 only when every one is
  return {
    **row,
    'check': 'exactly 0, as constructed'
    if zero
    else 'NOT 0: the arithmetic is not identical (a bug, or a platform difference)',
  }


def agreement_table(entries, pairs=(), noise=(), identical=(), platform=(), left_out=None):
  """The churn table (report_agreement.csv, COLUMNS): one row per pair of arms given for each
  kind (lists of (a, b) arm pairs; a compared pair that is also an identical-arithmetic pair is
  its identical row only), per arm one seed-churn row and (where seeds were repeated) one
  nondeterminism row; rows ordered by KINDS. Arms or pairs without shared seeds are left out.

  Two runs whose test data differ (another split seed, a legitimate arm of its own: different
  test images) are not compared image by image: each such pair of runs is appended to
  `left_out` (a list, when given; churns says what), and a row keeps the seeds whose runs
  predict one test set (none: no row)."""
  left_out = [] if left_out is None else left_out
  units = by_unit(entries)
  arms = sorted({a for a, _ in units})
  rows = [replicate_churn(units, arm, left_out) for arm in arms]
  same = {frozenset(p) for p in identical}
  pairs = [p for p in pairs if frozenset(p) not in same]  # said once, as identical arithmetic
  for kind, given in (
    ('identical', identical),
    ('noise', noise),
    ('contrast', pairs),
    ('platform', platform),
  ):
    for a, b in given:
      row = same_seed(units, kind, a, b, left_out) if a in arms and b in arms else None
      rows.append(check_identical(row) if row and kind == 'identical' else row)
  rows += [
    source_churn(entries, arm, *roles, left_out)
    for roles in (('data', 'init'), ('init', 'data'))
    for arm in arms
  ]
  seeds = [r for r in (seed_churn(units, arm, left_out) for arm in arms) if r is not None]
  rows += seeds + platform_seed_churn(seeds)
  table = pd.DataFrame([r for r in rows if r is not None], columns=list(COLUMNS))
  order = table['kind'].map({k: i for i, k in enumerate(KINDS)})
  return table.iloc[np.argsort(order.to_numpy(), kind='stable')].reset_index(drop=True)


def left_out_text(left_out, labels=None):
  """'6 pairs of runs on different test sets left out of the churn (f32 vs split7: fingerprint
  f00d vs beef, 6 pairs)': the pairs agreement_table left out, counted by pair of arms (named by
  `labels`, {arm: short label}) and reason, the three commonest named; '' when none."""
  if not left_out:
    return ''

  def name(arm):
    return (labels or {}).get(arm, arm)

  counts = collections.Counter((name(p['a']), name(p['b']), p['why']) for p in left_out)
  said = '; '.join(
    f'{a} vs {b}: {why}, {n} pair{"" if n == 1 else "s"}'
    for (a, b, why), n in counts.most_common(3)
  )
  more = f'; {len(counts) - 3} more pairs of arms' if len(counts) > 3 else ''
  return (
    f'{len(left_out)} pair{"" if len(left_out) == 1 else "s"} of runs on different test '
    f'sets left out of the churn ({said}{more})'
  )


def summary(table, missing=0, total=0):
  """One line for the report's first page: the churn ladder's rungs, mean churn (over seeds) of
  each kind present (the seed rung: every arm of a platform pooled, when there is such a row);
  says 'no predictions' when no run has any."""
  if total and missing == total:
    return (
      f'Agreement: no predictions in any of the {total} runs (a CSV, or records written '
      'before runs saved their test predictions); churn needs runs that save them.'
    )
  kinds = [k for k in KINDS if rung(table, k) is not None]
  if 'seed_all' in kinds:
    kinds.remove('seed')
  if not kinds:
    return 'Agreement: no pair of runs shares a seed, so no churn could be computed.'
  left = f'; {missing} of {total} runs without predictions left out' if missing else ''
  read = reading(table)
  return (
    f'Agreement ({DEFINITION}; mean over seeds): '
    + ', '.join(rung_text(table, k) for k in kinds)
    + left
    + (f'. Same model? {read[0].upper()}{read[1:]}' if read else '')
    + '.'
  )
