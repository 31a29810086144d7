"""Agreement between models from their saved test predictions: the churn ladder, calibration, the
training loss, per-class differences and the variance split (docs/statistics.md "Agreement")."""

import collections
import dataclasses
import itertools
import warnings
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.sparse import csgraph

from analysis import inputs, stats
from analysis.inputs import seed_key
from runrecord import record, rules

NOISY_FORMATS = ('bf16_noise',)  # numerics/formats.py's (the analysis reads records, not numerics)


@dataclasses.dataclass(frozen=True)
class Agreement:
  """The churn ladder (`table`) and its first-page `summary`, the calibration, training loss,
  per-class and variance tables, and the runs and pairs of runs left out."""

  table: pd.DataFrame
  summary: str
  calibration: pd.DataFrame
  train_loss: pd.DataFrame
  per_class: pd.DataFrame
  variance: pd.DataFrame
  missing: list[str]
  variance_notes: list[str] = dataclasses.field(default_factory=list)
  left_out: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def unit_name(entry):
  """What churn counts for this run's task."""
  return 'image × attribute labels' if np.ndim(entry['pred']['predicted']) > 1 else 'images'


def seeds_of(units, arm):
  """The models of `arm` in seed order (runrecord.rules.model_keys: seed, then as text)."""
  return sorted(
    (s for a, s in units if a == arm), key=lambda s: (seed_key(str(s).split(' (')[0]), str(s))
  )


def seed_row(kind, a, b, pairing, values, labels, unit, units):
  """One row of the table: the mean over seeds of `values` (fractions) with its t-interval, %."""
  x = 100 * np.asarray(values, float)
  low, high = (100 * v for v in stats.proportion_mean_ci(values)) if len(x) else (np.nan,) * 2

  def first(arm):
    return next((e['platform'] for (u, _), es in units.items() if u == arm for e in es), '')

  row = dict(kind=kind, a=a, b=b, platform_a=first(a), platform_b=first(b), pairing=pairing)
  row |= dict(churn_pct=x.mean() if len(x) else np.nan, ci_low=low, ci_high=high, seeds=len(x))
  row |= dict(seed_list=', '.join(map(str, labels)), per_seed_pct=', '.join(f'{v:.3g}' for v in x))
  return row | dict(unit=unit, check='', values=list(values))  # values: for pooling, no column


def both_differ(units, arm, s, t):
  """Do models s and t of `arm` differ in initial weights and in data order (True unrecorded)."""
  (i1, d1), (i2, d2) = (
    (units[(arm, x)][0].get('init'), units[(arm, x)][0].get('data')) for x in (s, t)
  )
  if None in (i1, d1, i2, d2):
    return True
  return str(i1) != str(i2) and str(d1) != str(d2)


def disjoint_pairs(units, arm):
  """Pairs of different models of `arm` that differ in init and data order (both_differ)."""
  seeds, used, pairs = seeds_of(units, arm), set(), []
  for i, s in enumerate(seeds):
    if s in used:
      continue
    t = next((t for t in seeds[i + 1 :] if t not in used and both_differ(units, arm, s, t)), None)
    if t is not None:
      pairs.append((s, t))
      used |= {s, t}
  return pairs


# The rungs of the churn ladder, in its order, and what each compares.
KIND_TITLES = {
  'nondeterminism': 'nondeterminism (same-seed replicates)',
  'identical': 'identical arithmetic (0 by construction)',
  'noise': 'perturbation (noise arm vs its arm)',
  'contrast': 'numerics setting',
  'platform': 'platform',
  'data order': 'data order only (same init seed)',
  'init': 'initial weights only (same data seed)',
  'seed': 'seed: init and data order (two seeds of one arm)',
  'seed_all': 'seed: init and data order (every arm of a platform, clustered)',
}
KINDS = tuple(KIND_TITLES)
# What the first page calls each rung (the title's part before ' ('): which source of difference.
SHORT_TITLES = {k: v.split(' (')[0] for k, v in KIND_TITLES.items()}
SAME, DIFFERENT = 'same seed', 'different seeds'
DEFINITION = 'churn, the share of predicted test labels that differ'  # named so everywhere
COLUMNS = tuple(k for k in seed_row('', '', '', '', [], [], '', {}) if k != 'values')


def churn(pred_a, pred_b):
  """Share of predictions that differ: mean of [ŷ_A ≠ ŷ_B] over every element (images)."""
  a, b = np.asarray(pred_a), np.asarray(pred_b)
  if a.shape != b.shape:
    raise ValueError(f'predictions of shapes {a.shape} and {b.shape} cannot be compared')
  return float(np.mean(a != b))


def different_data(entry_a, entry_b):
  """Why two runs' predictions cannot be compared image by image."""
  pa, pb = entry_a['pred'], entry_b['pred']
  for field, name in (('fingerprint', 'split fingerprint'), ('task', 'task')):
    if pa[field] != pb[field]:
      return f'{name} {pa[field]} vs {pb[field]}'
  return None


def pair_churn(entry_a, entry_b):
  """churn between two runs' predictions; refused when their test data or task differ."""
  why = different_data(entry_a, entry_b)
  if why:
    raise ValueError(
      f'agreement: {entry_a["run"]} and {entry_b["run"]} predict different test '
      f'data ({why}); compare runs of one data set'
    )
  return churn(entry_a['pred']['predicted'], entry_b['pred']['predicted'])


def churns(pairs, left_out):
  """The churn of each (entry, entry) pair whose test data agree; each other pair is left out."""
  values = []
  for x, y in pairs:
    why = different_data(x, y)
    if why:
      left_out.append(
        {'a': x['arm'], 'b': y['arm'], 'run_a': x['run'], 'run_b': y['run'], 'why': why}
      )
    else:
      values.append(churn(x['pred']['predicted'], y['pred']['predicted']))
  return values


def cross_mean(left, right, left_out):
  """Mean churn over every (left, right) pair of replicate entries that share their test data."""
  values = churns(itertools.product(left, right), left_out)
  return float(np.mean(values)) if values else None


def clusters(pairs):
  """[[indices of the pairs in one cluster]]: pairs sharing a seed, transitively."""
  share = np.array([[bool(set(p) & set(q)) for q in pairs] for p in pairs])
  count, label = csgraph.connected_components(share, directed=False)
  return [np.flatnonzero(label == k).tolist() for k in range(count)]


def agreement_table(entries, pairs=(), noise=(), identical=(), platform=(), left_out=None):
  """The churn table (report_agreement.csv, COLUMNS)."""
  left_out = [] if left_out is None else left_out
  units = {}  # {(arm, seed): [entries]} in the entries' order
  for e in entries:
    units.setdefault((e['arm'], e['seed']), []).append(e)
  arms = sorted({a for a, _ in units})
  rows = []
  for arm in arms:  # nondeterminism: same-seed replicates, per seed with >= 2 runs
    repeated = [s for s in seeds_of(units, arm) if len(units[(arm, s)]) > 1]
    found = {s: churns(itertools.combinations(units[(arm, s)], 2), left_out) for s in repeated}
    repeated = [s for s in repeated if found[s]]
    if repeated:
      unit = unit_name(units[(arm, repeated[0])][0])
      means = [np.mean(found[s]) for s in repeated]
      rows.append(seed_row('nondeterminism', arm, arm, SAME, means, repeated, unit, units))
  same = {frozenset(p) for p in identical}
  pairs = [p for p in pairs if frozenset(p) not in same]  # said once, as identical arithmetic
  for kind, given in (
    ('identical', identical),
    ('noise', noise),
    ('contrast', pairs),
    ('platform', platform),
  ):
    for a, b in given:  # the churn of a and b over their shared seeds (cross pairs averaged)
      shared = seeds_of(units, a) if a in arms and b in arms else []
      by_seed = {
        s: cross_mean(units[(a, s)], units[(b, s)], left_out) for s in shared if (b, s) in units
      }
      shared = [s for s, v in by_seed.items() if v is not None]
      if not shared:
        continue
      unit = unit_name(units[(a, shared[0])][0])
      row = seed_row(kind, a, b, SAME, [by_seed[s] for s in shared], shared, unit, units)
      if kind == 'identical':  # a mean of non-negative churns is 0 only when each one is
        bad = 'NOT 0: the arithmetic is not identical (a bug, or a platform difference)'
        row['check'] = 'exactly 0, as constructed' if row['churn_pct'] == 0 else bad
      rows.append(row)
  for varied, fixed in (('data', 'init'), ('init', 'data')):
    for arm in arms:  # churn from one source of one arm: runs equal in `fixed` ('init' or 'data')
      cells = {}
      for e in entries:
        if e['arm'] == arm and e.get('init') is not None and e.get('data') is not None:
          cells.setdefault(e[fixed], {}).setdefault(e[varied], []).append(e)
      values, labels = [], []
      for level in sorted(cells, key=seed_key):
        varied_levels = sorted(cells[level], key=seed_key)
        pairs_of = zip(varied_levels[0::2], varied_levels[1::2], strict=False)
        means = [cross_mean(cells[level][x], cells[level][y], left_out) for x, y in pairs_of]
        means = [m for m in means if m is not None]
        if means:
          values.append(np.mean(means))
          labels.append(level)
      if values:
        kind = 'data order' if varied == 'data' else 'init'
        one = unit_name(next(iter(next(iter(cells.values())).values()))[0])
        row = seed_row(kind, arm, arm, DIFFERENT, values, labels, one, units)
        rows.append({**row, 'seed_list': f'{fixed} seeds ' + row['seed_list']})
  seeds = []
  for arm in arms:  # churn between different seeds of one arm: disjoint_pairs (independent)
    by_pair = {
      p: cross_mean(units[(arm, p[0])], units[(arm, p[1])], left_out)
      for p in disjoint_pairs(units, arm)
    }
    found_pairs = [p for p, v in by_pair.items() if v is not None]
    if found_pairs:
      unit = unit_name(units[(arm, seeds_of(units, arm)[0])][0])
      labels = [f'{s}-{t}' for s, t in found_pairs]
      means = [by_pair[p] for p in found_pairs]
      row = seed_row('seed', arm, arm, DIFFERENT, means, labels, unit, units)
      seeds.append({**row, 'pairs': found_pairs})  # pairs: kept for clustering, not a column
  rows += seeds
  for where in sorted({r['platform_a'] for r in seeds}):  # 'seed_all': every arm of a platform
    group = [r for r in seeds if r['platform_a'] == where]
    if len(group) < 2:
      continue
    values = [v for r in group for v in r['values']]
    found = clusters([p for r in group for p in r['pairs']])
    name = f'every arm on {where}'
    means = [float(np.mean([values[i] for i in c])) for c in found]
    row = seed_row('seed_all', name, name, DIFFERENT, means, [], group[0]['unit'], {})
    listed = f'{len(values)} pairs of {len(group)} arms in {len(found)} clusters of shared seeds'
    rows.append({**row, 'platform_a': where, 'platform_b': where, 'seed_list': listed})
  table = pd.DataFrame(rows, columns=list(COLUMNS))
  order = table['kind'].map({k: i for i, k in enumerate(KINDS)})
  return table.iloc[np.argsort(order.to_numpy(), kind='stable')].reset_index(drop=True)


def left_out_text(left_out, labels=None):
  """'6 pairs of runs on different test sets left out of the churn (f32 vs split7)."""
  if not left_out:
    return ''
  labels = labels or {}
  counts = collections.Counter(
    (labels.get(p['a'], p['a']), labels.get(p['b'], p['b']), p['why']) for p in left_out
  )
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
  """The first page's line: the churn ladder's rungs, each kind's mean churn over seeds."""
  if total and missing == total:
    return (
      f'Agreement: no predictions in any of the {total} runs (a CSV, or records written '
      'before runs saved their test predictions); churn needs runs that save them.'
    )
  rungs = {k: table[table['kind'] == k] for k in KINDS if (table['kind'] == k).any()}
  if 'seed_all' in rungs:
    del rungs['seed']
  if not rungs:
    return 'Agreement: no pair of runs shares a seed, so no churn could be computed.'
  left = f'; {missing} of {total} runs without predictions left out' if missing else ''
  texts = []
  for kind, rows in rungs.items():  # 'numerics setting 1.2–3.5 %': the range of the rows' means
    low, high = (f'{v:.2g}' for v in (rows['churn_pct'].min(), rows['churn_pct'].max()))
    title = SHORT_TITLES[kind]
    span = f'{title} {low} %' if low == high else f'{title} {low}–{high} %'
    failed = ~rows['check'].str.startswith('exactly 0')  # identical arithmetic: exactly 0?
    if kind != 'identical':
      texts.append(span)
    elif not failed.any():
      texts.append(f'{title} exactly 0 (checked)')
    else:
      texts.append(f'{span}, NOT 0 in {int(failed.sum())} of {len(rows)} pairs')
  read = against_seeds(table)  # the numerics rows against the seed-to-seed churn
  same = (
    f'. Same model? Read against the churn between two seeds ({read.base}): {read.changed} of '
    f'{read.rows} numerics settings change the model (churn above 0), '
    f"{read.ratio_low:.2g}–{read.ratio_high:.2g} × a new seed's churn; {seed_verdict(read)}"
    if read
    else ''
  )
  return f'Agreement ({DEFINITION}; mean over seeds): ' + ', '.join(texts) + left + same + '.'


def baseline(table, platform):
  """(mean, low, high) % of the seed-to-seed churn on `platform`: its pooled 'seed_all' row."""
  for kind in ('seed_all', 'seed'):
    rows = table[(table['kind'] == kind) & (table['platform_a'] == platform)]
    if not rows.empty:
      return rows['churn_pct'].mean(), rows['ci_low'].min(), rows['ci_high'].max()
  return None


class SeedReading(NamedTuple):
  """The numerics rows read against the seed-to-seed churn of their platform: how many `rows`,
  how many `changed` the model (churn above 0), their churn range (`low`, `high`, %) and as a
  multiple of the seed churn (`ratio_low`, `ratio_high`), how many intervals lie wholly `below` /
  `above` the seed churn's, and the seed churns (`base`, text)."""

  rows: int
  changed: int
  low: float
  high: float
  ratio_low: float
  ratio_high: float
  below: int
  above: int
  base: str


def against_seeds(table):
  """The SeedReading of the numerics rows (baseline), or None without both kinds."""
  rows = [
    (r, baseline(table, r['platform_a'])) for _, r in table.iterrows() if r['kind'] == 'contrast'
  ]
  rows = [(r, b) for r, b in rows if b is not None and b[0] > 0]
  if not rows:
    return None
  ratio = [r['churn_pct'] / b[0] for r, b in rows]
  churn = [r['churn_pct'] for r, _ in rows]
  return SeedReading(
    rows=len(rows),
    changed=sum(c > 0 for c in churn),
    low=min(churn),
    high=max(churn),
    ratio_low=min(ratio),
    ratio_high=max(ratio),
    below=sum(r['ci_high'] < b[1] for r, b in rows),
    above=sum(r['ci_low'] > b[2] for r, b in rows),
    base=', '.join(f'{b:.2g} %' for b in sorted({round(b[0], 6) for _, b in rows})),
  )


def seed_verdict(read):
  """How the settings' churn compares with a new seed's, in words (against_seeds)."""
  if read.below == read.rows:
    return 'every one changes fewer predictions than a new seed does'
  if read.above:
    return f'{read.above} change more predictions than a new seed does'
  return (
    f'{read.below} of them change fewer predictions than a new seed does, the others '
    'about as many (intervals overlapping)'
  )


# The recorded arithmetic of an arm: stats.IDENTICAL_FIELDS but where it ran and the XLA flags.
ARITHMETIC = tuple(stats.EFFECTIVE + f for f in stats.IDENTICAL_FIELDS[2:-1])
EMULATED = (stats.EFFECTIVE + 'emulated.conv', stats.EFFECTIVE + 'emulated.dense')
NOISE_FREE = 'f32'  # the format a noisy format perturbs


def arm_facts(runs, group_by):
  """{arm: {column: value as text}} of the group-by, arithmetic and emulation columns."""
  columns = [c for c in dict.fromkeys([*group_by, 'platform', *ARITHMETIC, *EMULATED]) if c in runs]
  facts = {}
  for arm, group in runs.groupby('arm', sort=True):
    first = group.iloc[0]
    facts[arm] = {c: str(first[c]) for c in columns}
    facts[arm]['deterministic'] = bool('det' in group and group['det'].eq(True).all())
  return facts


def equal_in(fa, fb, columns):
  return all(fa.get(c) == fb.get(c) for c in columns)


def not_numerics(group_by):
  """The group-by columns that are neither requested numerics nor where the run executed."""
  return [
    c for c in group_by if not c.startswith(record.ARM_PREFIX) and c not in record.ARM_CONTEXT
  ]


def platform_pairs(runs, group_by):
  """[(a, b)]: the same arm levels on two platforms (a's platform sorts first)."""
  facts = arm_facts(runs, group_by)
  same = [c for c in group_by if c not in record.ARM_CONTEXT]
  return [
    (a, b) if facts[a].get('platform', '') <= facts[b].get('platform', '') else (b, a)
    for a, b in itertools.combinations(facts, 2)
    if facts[a].get('platform') != facts[b].get('platform') and equal_in(facts[a], facts[b], same)
  ]


def identical_pairs(runs, group_by):
  """[(a, b)]: arms of one deterministic platform with the same recorded arithmetic."""
  facts = arm_facts(runs, group_by)
  same = ['platform', 'device_kind', *ARITHMETIC, *not_numerics(group_by)]
  return [
    (a, b)
    for a, b in itertools.combinations(facts, 2)
    if facts[a]['deterministic']
    and facts[b]['deterministic']
    and all(c in facts[a] for c in ARITHMETIC)
    and equal_in(facts[a], facts[b], same)
  ]


def noise_pairs(runs, group_by):
  """[(noise arm, the arm it perturbs)] on each platform (module doc)."""
  facts = arm_facts(runs, group_by)
  same = ['platform', 'device_kind', *not_numerics(group_by)]
  pairs = []
  for noisy, fn in facts.items():
    if not any(fn.get(c) in NOISY_FORMATS for c in ARITHMETIC):
      continue
    quiet = {c: NOISE_FREE if fn.get(c) in NOISY_FORMATS else fn.get(c) for c in ARITHMETIC}
    found = [
      arm
      for arm, f in facts.items()
      if arm != noisy and equal_in(f, fn, same) and equal_in(f, quiet, ARITHMETIC)
    ]
    emulated = [arm for arm in found if equal_in(facts[arm], fn, EMULATED)]
    pairs += [(noisy, arm) for arm in (emulated or found)]
  return pairs


ECE_BINS = 15
ECE_NAME = f'ECE, {ECE_BINS} equal-width confidence bins over [0, 1]'
EPS = float(np.finfo(np.float32).tiny)
ACCURACY = 'final.test_accuracy'  # the accuracy loss_table shows beside the loss


def ece(confidence, correct, bins=ECE_BINS):
  """Expected calibration error Σ_b (n_b/n)|acc_b − conf_b| over equal-width confidence bins."""
  confidence = np.ravel(np.asarray(confidence, np.float64))
  correct = np.ravel(np.asarray(correct, np.float64))
  which = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
  n_b = np.bincount(which, minlength=bins)
  acc_sum = np.bincount(which, weights=correct, minlength=bins)
  conf_sum = np.bincount(which, weights=confidence, minlength=bins)
  full = n_b > 0
  gap = np.abs(acc_sum[full] - conf_sum[full]) / n_b[full]
  return float(np.sum(n_b[full] / len(confidence) * gap))


def run_calibration(pred):
  """{'accuracy', 'nll', 'ece'} of one run's predictions (formulas: module doc)."""
  label, predicted = np.asarray(pred['label']), np.asarray(pred['predicted'])
  correct = predicted == label
  if 'probability' in pred:  # the attributes task: 40 binary predictions per image
    p = np.clip(np.asarray(pred['probability'], np.float64), EPS, 1 - EPS)
    y = label.astype(np.float64)
    nll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    confidence = np.maximum(p, 1 - p)
  else:
    nll = -np.mean(np.log(np.maximum(np.asarray(pred['p_label'], np.float64), EPS)))
    confidence = pred['p_predicted']
  return {'accuracy': float(np.mean(correct)), 'nll': float(nll), 'ece': ece(confidence, correct)}


def run_table(entries):
  """One row per run with predictions: run, arm, seed, platform, accuracy_pct, nll, ece_pct."""
  columns = ['run', 'arm', 'seed', 'platform', 'accuracy_pct', 'nll', 'ece_pct']
  rows = []
  for e in entries:
    c = run_calibration(e['pred'])
    values = [100 * c['accuracy'], c['nll'], 100 * c['ece']]
    rows.append(dict(zip(columns, [e[k] for k in columns[:4]] + values, strict=True)))
  return pd.DataFrame(rows, columns=columns)


def per_arm(frame, columns):
  """Per arm: each of `columns` averaged per seed (replicates), then mean, ci_low."""
  units = frame.groupby(['arm', 'seed'], sort=True, dropna=False)[columns].mean().reset_index()
  rows = []
  for arm, group in units.groupby('arm', sort=True):
    row = {'arm': arm, 'seeds': len(group)}
    for col in columns:
      x = group[col].dropna().to_numpy(float)
      low, high = stats.t_ci(x)
      row |= {col: x.mean() if len(x) else np.nan, f'{col}_ci_low': low, f'{col}_ci_high': high}
    rows.append(row)
  return pd.DataFrame(rows)


def calibration_table(entries):
  """Per arm: accuracy_pct, nll and ece_pct (ECE_NAME) with their t-intervals over seeds."""
  table = per_arm(run_table(entries), ['accuracy_pct', 'nll', 'ece_pct'])
  if not table.empty:
    table['ece_binning'] = ECE_NAME
  return table


def loss_table(runs, scale=None):
  """Per arm: the final training loss beside the test accuracy (%)."""
  if 'final.train_loss' not in runs or ACCURACY not in runs:
    return pd.DataFrame()
  values = pd.to_numeric(runs[ACCURACY], errors='coerce')
  if scale is None:
    scale = 100.0 if values.abs().max() <= 1 else 1.0
  loss = pd.to_numeric(runs['final.train_loss'], errors='coerce')
  frame = runs[['arm', 'seed']].assign(train_loss=loss, test_accuracy_pct=scale * values)
  table = per_arm(frame, ['test_accuracy_pct', 'train_loss'])
  table['train_loss_ratio'] = table['train_loss'] / table['train_loss'].min()
  return table


PER_CLASS_COLUMNS = tuple(
  'a b class seeds diff_pp ci_low ci_high t p p_holm different test'.split()
)
T_TEST = 'paired t'
EXACT = 'exact signed-rank (constant difference)'
NONE = 'none (every difference 0)'


def class_accuracy(pred):
  """Accuracy per class (classification: over the images of each true class)."""
  label, predicted = np.asarray(pred['label']), np.asarray(pred['predicted'])
  if label.ndim > 1:
    return np.mean(label == predicted, axis=0)
  classes = max(int(label.max()), int(predicted.max())) + 1
  right = np.bincount(label, weights=(label == predicted), minlength=classes)
  count = np.bincount(label, minlength=classes)
  with np.errstate(invalid='ignore', divide='ignore'):
    return right / count


def pad(x, width):
  """x with NaN appended up to `width` entries (classes absent from a run's predictions)."""
  return np.pad(x, (0, width - len(x)), constant_values=np.nan)


def seed_accuracies(entries, arm):
  """{seed: per-class accuracy averaged over the arm's replicates of that seed}."""
  by_seed = {}
  for e in entries:
    if e['arm'] == arm:
      by_seed.setdefault(e['seed'], []).append(class_accuracy(e['pred']))
  width = max((len(a) for v in by_seed.values() for a in v), default=0)
  return {s: np.mean([pad(a, width) for a in v], axis=0) for s, v in by_seed.items()}


def class_differences(entries, a, b):
  """One row per class (PER_CLASS_COLUMNS): A − B in pp over the shared seeds (< 2: none)."""
  acc_a, acc_b = seed_accuracies(entries, a), seed_accuracies(entries, b)
  shared = sorted(set(acc_a) & set(acc_b), key=seed_key)
  if len(shared) < 2:
    return pd.DataFrame(columns=list(PER_CLASS_COLUMNS))
  width = max(len(acc_a[shared[0]]), len(acc_b[shared[0]]))  # d: seeds × classes
  d = 100 * np.array([pad(acc_a[s], width) - pad(acc_b[s], width) for s in shared])
  low, high = stats.t_ci(d.T)
  with warnings.catch_warnings(), np.errstate(invalid='ignore', divide='ignore'):
    warnings.simplefilter('ignore')
    t = sps.ttest_1samp(d, 0.0, axis=0)
  finite = np.all(np.isfinite(d), axis=0)  # a class absent from the test set: NaN, no test
  varies = finite & (np.ptp(np.where(np.isfinite(d), d, 0), axis=0) > 0)
  constant = finite & ~varies & ~np.all(d == 0, axis=0)
  exact = [
    stats.signed_rank(column)[1] if c else np.nan for column, c in zip(d.T, constant, strict=True)
  ]
  p = np.where(varies, t.pvalue, np.where(constant, exact, np.nan))
  t, p, test = t.statistic, p, np.where(varies, T_TEST, np.where(constant, EXACT, NONE))
  p_holm = stats.holm(p)
  values = [a, b, np.arange(width), len(shared), d.mean(axis=0), low, high, t, p, p_holm]
  values += [p_holm < stats.ALPHA, test]
  return pd.DataFrame(dict(zip(PER_CLASS_COLUMNS, values, strict=True)))


def per_class_table(entries, pairs):
  """class_differences of every (a, b) pair given, stacked (Holm within each pair's classes)."""
  tables = [class_differences(entries, a, b) for a, b in pairs]
  tables = [t for t in tables if not t.empty]
  return (
    pd.concat(tables, ignore_index=True)
    if tables
    else pd.DataFrame(columns=list(PER_CLASS_COLUMNS))
  )


def summary_line(table, missing, total, left_out=(), labels=None):
  """The first page's agreement line, the runs and pairs left out counted by reason."""
  reasons = collections.Counter(str(why).split(' (', 1)[0] for _, why in missing)  # kinds
  counted = ', '.join(f'{n} {why}' for why, n in reasons.most_common())
  apart = left_out_text(left_out, labels)
  if not missing or set(reasons) == {inputs.NONE_SAVED}:
    line = summary(table, len(missing), total)
  elif len(missing) == total:
    return (
      f'Agreement: none of the {total} runs has predictions of the step its results came '
      f'from ({counted}); churn, calibration and per-class need them.'
    )
  else:
    line = (
      summary(table).rstrip('.') + f'; {len(missing)} of {total} runs left out '
      f'of the agreement, calibration and per-class tables ({counted}).'
    )
  return line[:-1] + f'; {apart}.' if apart else line


def agreement_section(
  runs, pairs, noise=(), identical=(), platform=(), load=None, labels=None, scale=None, read=None
):
  """The Agreement of the runs: churn ladder, calibration, training loss, per class, variance."""
  columns = stats.seed_columns(runs)
  if read is None:
    got = [
      (p, None if p is not None else inputs.NONE_SAVED)
      for p in map(load or (lambda run: None), runs['run'])
    ]
  else:
    got = read(runs)
  missing = [(run, why) for run, (pred, why) in zip(runs['run'], got, strict=True) if pred is None]
  base = runs['base_seed'] if 'base_seed' in runs else runs['seed']  # the model: the replicate rule
  seeds = rules.model_keys(base, *([runs[c] for c in columns] if columns else []))
  entries = []
  for i, (pred, _) in enumerate(got):
    if pred is not None:
      row = runs.iloc[i]
      init, data = (row[c] for c in columns) if columns else (None, None)
      where = str(row.get('platform', ''))
      entries.append(dict(run=row['run'], arm=row['arm'], seed=seeds[i], platform=where))
      entries[-1].update(pred=pred, init=init, data=data)
  split, notes = stats.split_by_arm(runs)
  left_out = []  # pairs of runs on different test sets (another split seed): not compared
  table = agreement_table(entries, pairs, noise, identical, platform, left_out)
  for side in ('a', 'b'):
    table[f'label_{side}'] = [(labels or {}).get(arm, arm) for arm in table[side]]
  return Agreement(
    table=table,
    summary=summary_line(table, missing, len(runs), left_out, labels),
    calibration=calibration_table(entries),
    train_loss=loss_table(runs, scale=scale),
    per_class=per_class_table(entries, pairs),
    variance=split,
    missing=[run for run, _ in missing],
    variance_notes=notes,
    left_out=left_out,
  )


def compared_pairs(out):
  """The (a, b) arms the study compares: its declared contrasts."""
  table = out.contrasts
  if table is not None and not table.empty:
    return list(zip(table['arm_a'], table['arm_b'], strict=True))
  runs = out.runs
  platform = (
    runs.groupby('arm')['platform'].first().astype(str)
    if 'platform' in runs
    else pd.Series('', index=sorted(runs['arm'].unique()))
  )
  return [
    (a, b)
    for a, b in itertools.combinations(sorted(platform.index), 2)
    if platform[a] == platform[b]
  ]


def from_analysis(out, labels, load=None, read=None):
  """agreement_section of the analysis `out`: its compared pairs and the ladder's baselines."""
  runs, by = out.runs, out.group_by
  scale = out.scale if out.metric == ACCURACY else None
  return agreement_section(
    runs,
    compared_pairs(out),
    noise=noise_pairs(runs, by),
    identical=identical_pairs(runs, by),
    platform=platform_pairs(runs, by),
    load=load,
    labels=labels,
    scale=scale,
    read=read,
  )
