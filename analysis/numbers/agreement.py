"""Agreement between models: churn, the share of test examples two models predict differently, per
seed and then across seeds, read against its baselines (the churn ladder). Numbers only:
analysis/numbers/agreement_section.py loads the predictions and writes the CSV, agreement_figure.py
draws.

Predictions: trainer/predictions.read_predictions's dict per run (test-set order): `predicted`
int32[n] (classification) or [n, 40] (the attributes task), `label`, `fingerprint`, `task`.

  churn(A, B)   = (1/n) Σ_i [ŷ_A(i) ≠ ŷ_B(i)]                   classification, over n images
                = (1/(40 n)) Σ_i Σ_k [ŷ_A(i, k) ≠ ŷ_B(i, k)]    attributes, over all n×40 bits

Units: `entries` is a list of dicts {run, arm, seed, platform, pred} (pred: the predictions dict);
the entries of one arm and seed are its replicates. Per seed s a pair gets one value c_s (its
replicates' cross pairs averaged); over the seeds the row reports the mean c̄ = (1/m) Σ_s c_s with
the Student t-interval c̄ ± t_{0.975, m−1} · sd(c_s)/√m (analysis.numbers.inference.t_ci): seeds are
the independent units, not images (a Wilson interval over the images of all seeds pooled ignores the
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
  seed                one arm, different seeds: disjoint pairs of its sorted seeds (s1, s2),
                      (s3, s4), ... so the pairs are independent (different seeds)
  seed_all            the seed rows of every arm of one platform as one sample (a = b = 'every
                      arm on PLATFORM'): the pairs of different arms are different models, so
                      still independent; the t-interval is over all those pairs
"""

import itertools

import numpy as np
import pandas as pd

from analysis.inputs.labels import seed_key
from analysis.numbers import inference

KINDS = ('nondeterminism', 'identical', 'noise', 'contrast', 'platform', 'data order', 'init',
         'seed', 'seed_all')
KIND_TITLES = {'nondeterminism': 'nondeterminism (same-seed replicates)',
               'identical': 'identical arithmetic (0 by construction)',
               'noise': 'perturbation (noise arm vs its arm)', 'contrast': 'numerics setting',
               'platform': 'platform', 'data order': 'data order (same init seed)',
               'init': 'initial weights (same data seed)', 'seed': 'seed (two seeds of one arm)',
               'seed_all': 'seed (two seeds of one arm, every arm of a platform)'}
SAME, DIFFERENT = 'same seed', 'different seeds'
CI_NAME = '95% Student t-interval over seeds'
COLUMNS = ('kind', 'a', 'b', 'platform_a', 'platform_b', 'pairing', 'churn_pct', 'ci_low',
           'ci_high', 'seeds', 'seed_list', 'per_seed_pct', 'unit', 'check')


def churn(pred_a, pred_b):
  """Share of predictions that differ: mean of [ŷ_A ≠ ŷ_B] over every element (images, or
  images × attributes for the attributes task)."""
  a, b = np.asarray(pred_a), np.asarray(pred_b)
  if a.shape != b.shape:
    raise ValueError(f'predictions of shapes {a.shape} and {b.shape} cannot be compared')
  return float(np.mean(a != b))


def unit_name(entry):
  """What churn counts for this run's task."""
  return ('image×attribute bits' if np.ndim(entry['pred']['predicted']) > 1 else 'images')


def pair_churn(entry_a, entry_b):
  """churn between two runs' predictions; ValueError naming both runs when their test data
  (fingerprint) or task differ."""
  pa, pb = entry_a['pred'], entry_b['pred']
  for field in ('fingerprint', 'task'):
    if pa[field] != pb[field]:
      raise ValueError(f'agreement: {entry_a["run"]} and {entry_b["run"]} predict different test '
                       f'data ({field} {pa[field]} vs {pb[field]}); compare runs of one data set')
  return churn(pa['predicted'], pb['predicted'])


def by_unit(entries):
  """{(arm, seed): [entries]} in the entries' order."""
  units = {}
  for e in entries:
    units.setdefault((e['arm'], e['seed']), []).append(e)
  return units


def seeds_of(units, arm):
  return sorted((s for a, s in units if a == arm), key=seed_key)


def cross_mean(left, right):
  """Mean churn over every (left, right) pair of replicate entries."""
  return float(np.mean([pair_churn(x, y) for x in left for y in right]))


def seed_row(kind, a, b, pairing, values, labels, unit, units):
  """One row of the table: the mean over seeds of `values` (fractions) with its t-interval, %."""
  x = 100 * np.asarray(values, float)
  low, high = inference.t_ci(x) if len(x) else (np.nan, np.nan)
  first = lambda arm: next((e['platform'] for (u, _), es in units.items() if u == arm
                            for e in es), '')
  return {'kind': kind, 'a': a, 'b': b, 'platform_a': first(a), 'platform_b': first(b),
          'pairing': pairing, 'churn_pct': x.mean() if len(x) else np.nan, 'ci_low': low,
          'ci_high': high, 'seeds': len(x), 'seed_list': ', '.join(map(str, labels)),
          'per_seed_pct': ', '.join(f'{v:.3g}' for v in x), 'unit': unit, 'check': '',
          'values': list(values)}  # kept for pooling, not a column


def same_seed(units, kind, a, b):
  """Per shared seed s: c_s = churn(a's model, b's model) (replicates: their cross pairs
  averaged); the row of its mean over seeds, or None when the arms share no seed."""
  shared = [s for s in seeds_of(units, a) if (b, s) in units]
  if not shared:
    return None
  values = [cross_mean(units[(a, s)], units[(b, s)]) for s in shared]
  return seed_row(kind, a, b, SAME, values, shared, unit_name(units[(a, shared[0])][0]), units)


def seed_churn(units, arm):
  """Churn between different seeds of one arm: disjoint pairs (s1, s2), (s3, s4), ... of its
  sorted seeds (independent pairs); None with fewer than two seeds."""
  seeds = seeds_of(units, arm)
  pairs = list(zip(seeds[0::2], seeds[1::2]))
  if not pairs:
    return None
  values = [cross_mean(units[(arm, s)], units[(arm, t)]) for s, t in pairs]
  labels = [f'{s}-{t}' for s, t in pairs]
  return seed_row('seed', arm, arm, DIFFERENT, values, labels,
                  unit_name(units[(arm, seeds[0])][0]), units)


def platform_seed_churn(seed_rows):
  """Per platform with >= 2 arms: one 'seed_all' row over the seed pairs of all its arms."""
  rows = []
  for platform in sorted({r['platform_a'] for r in seed_rows}):
    group = [r for r in seed_rows if r['platform_a'] == platform]
    if len(group) < 2:
      continue
    values = [v for r in group for v in r['values']]
    name = f'every arm on {platform}'
    row = seed_row('seed_all', name, name, DIFFERENT, values, [], group[0]['unit'], {})
    rows.append({**row, 'platform_a': platform, 'platform_b': platform,
                 'seed_list': f'{len(values)} pairs of {len(group)} arms'})
  return rows


def source_churn(entries, arm, varied, fixed):
  """Churn from one source of one arm: runs equal in `fixed` ('init' or 'data'), different in
  `varied`; per level of `fixed`, the mean churn over disjoint pairs of its sorted `varied`
  levels (replicates: their cross pairs); the row over the levels of `fixed`. None without
  such pairs (or without recorded init and data seeds)."""
  cells = {}
  for e in entries:
    if e['arm'] == arm and e.get('init') is not None and e.get('data') is not None:
      cells.setdefault(e[fixed], {}).setdefault(e[varied], []).append(e)
  values, labels = [], []
  for level in sorted(cells, key=seed_key):
    varied_levels = sorted(cells[level], key=seed_key)
    pairs = list(zip(varied_levels[0::2], varied_levels[1::2]))
    if pairs:
      values.append(np.mean([cross_mean(cells[level][x], cells[level][y]) for x, y in pairs]))
      labels.append(level)
  if not values:
    return None
  kind = 'data order' if varied == 'data' else 'init'
  one = next(iter(next(iter(cells.values())).values()))[0]
  row = seed_row(kind, arm, arm, DIFFERENT, values, labels, unit_name(one), by_unit(entries))
  return {**row, 'seed_list': f'{fixed} seeds ' + row['seed_list']}


def replicate_churn(units, arm):
  """Churn between same-seed replicates of one arm: per seed with >= 2 runs, the mean churn over
  its replicate pairs; None when no seed of the arm was repeated."""
  repeated = [s for s in seeds_of(units, arm) if len(units[(arm, s)]) > 1]
  if not repeated:
    return None
  values = [np.mean([pair_churn(x, y) for x, y in itertools.combinations(units[(arm, s)], 2)])
            for s in repeated]
  return seed_row('nondeterminism', arm, arm, SAME, values, repeated,
                  unit_name(units[(arm, repeated[0])][0]), units)


def check_identical(row):
  """The identical-arithmetic row's check: every seed's churn exactly 0, as constructed."""
  zero = row['churn_pct'] == 0  # a mean of non-negative churns is 0 only when every one is
  return {**row, 'check': 'exactly 0, as constructed' if zero else
          'NOT 0: the arithmetic is not identical (a bug, or a platform difference)'}


def agreement_table(entries, pairs=(), noise=(), identical=(), platform=()):
  """The churn table (report_agreement.csv, COLUMNS): one row per pair of arms given for each
  kind (lists of (a, b) arm pairs), per arm one seed-churn row and (where seeds were repeated)
  one nondeterminism row; rows ordered by KINDS. Arms or pairs without shared seeds are left
  out."""
  units = by_unit(entries)
  arms = sorted({a for a, _ in units})
  rows = [replicate_churn(units, arm) for arm in arms]
  for kind, given in (('identical', identical), ('noise', noise), ('contrast', pairs),
                      ('platform', platform)):
    for a, b in given:
      row = same_seed(units, kind, a, b) if a in arms and b in arms else None
      rows.append(check_identical(row) if row and kind == 'identical' else row)
  rows += [source_churn(entries, arm, *roles) for roles in (('data', 'init'), ('init', 'data'))
           for arm in arms]
  seeds = [r for r in (seed_churn(units, arm) for arm in arms) if r is not None]
  rows += seeds + platform_seed_churn(seeds)
  table = pd.DataFrame([r for r in rows if r is not None], columns=list(COLUMNS))
  order = table['kind'].map({k: i for i, k in enumerate(KINDS)})
  return table.iloc[np.argsort(order.to_numpy(), kind='stable')].reset_index(drop=True)


def rung(table, kind):
  """The rows of one kind, or None."""
  rows = table[table['kind'] == kind]
  return rows if not rows.empty else None


def span(rows):
  """'3.5 %' for one row (or rows that round alike), '1.2–3.5 %' (their range of means)."""
  low, high = (f'{v:.2g}' for v in (rows['churn_pct'].min(), rows['churn_pct'].max()))
  return f'{low} %' if low == high else f'{low}–{high} %'


def rung_text(table, kind):
  """'numerics setting 1.2–3.5 %'; identical arithmetic says whether it was exactly 0."""
  rows = rung(table, kind)
  title = 'seed' if kind == 'seed_all' else KIND_TITLES[kind].split(' (')[0]
  if kind != 'identical':
    return f'{title} {span(rows)}'
  failed = ~rows['check'].str.startswith('exactly 0')
  return (f'{title} exactly 0 (checked)' if not failed.any() else
          f'{title} {span(rows)}, NOT 0 in {int(failed.sum())} of {len(rows)} pairs')


def summary(table, missing=0, total=0):
  """One line for the report's first page: the churn ladder's rungs, mean churn (over seeds) of
  each kind present (the seed rung: every arm of a platform pooled, when there is such a row);
  says 'no predictions' when no run has any."""
  if total and missing == total:
    return (f'Agreement: no predictions in any of the {total} runs (a CSV, or records written '
            'before runs saved their test predictions); churn needs runs that save them.')
  kinds = [k for k in KINDS if rung(table, k) is not None]
  if 'seed_all' in kinds:
    kinds.remove('seed')
  if not kinds:
    return 'Agreement: no pair of runs shares a seed, so no churn could be computed.'
  left = f'; {missing} of {total} runs without predictions left out' if missing else ''
  return ('Agreement (churn, the share of test predictions that differ, mean over seeds): '
          + ', '.join(rung_text(table, k) for k in kinds) + left + '.')
