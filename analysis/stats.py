"""Per-arm summaries and pairwise tests of a metric over seeds, from Orbax results or a CSV.

  python -m analysis.stats --runs=/tmp/study --margin=0.5
  python -m analysis.stats --runs=gs://bucket/study --group-by platform compute_dtype --format=latex
  python -m analysis.stats --csv=published.csv --group-by platform --metric accuracy --seed-col seed

An arm is a set of runs with equal values in the group-by columns (default: platform, device_kind
and every requested numerics field). Each seed counts once per arm (later duplicates are reported,
not used); runs that are not 'completed' are excluded and listed with their reason. Accuracies
stored as fractions are reported in percent, so differences and `--margin` are percentage points.
The tables are rendered (Markdown, LaTeX, CSV) by analysis/style.py.
"""

import argparse
import itertools
import sys
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats import power as smp

ALPHA = 0.05
POWER = 0.8
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 9999
DEFAULT_METRIC = 'final.test_accuracy'
NUMERICS_FIELDS = ('matmul_precision', 'compute_dtype', 'param_dtype', 'emulate',
                   'batchnorm_group', 'gpu_deterministic')
DET_COLUMNS = ('deterministic', 'numerics.effective.gpu_deterministic',
               'numerics.requested.gpu_deterministic', 'config.numerics.gpu_deterministic',
               'gpu_deterministic')


def resolve_column(frame, name, arg):
  """The column of `frame` that `name` means: exact, or with a numerics/config/final prefix."""
  for candidate in (name, f'numerics.requested.{name}', f'numerics.effective.{name}',
                    f'config.{name}', f'final.{name}'):
    if candidate in frame.columns:
      return candidate
  shown = ', '.join(c for c in frame.columns if not c.startswith(('config.', 'versions.', 'data.')))
  raise ValueError(f'{arg}: no column {name!r}; choose from {shown} (or any config.* field)')


def default_group_by(frame):
  """platform, device_kind and the requested numerics fields that the runs have."""
  cols = [c for c in ('platform', 'device_kind') if c in frame.columns]
  return cols + [f'numerics.requested.{f}' for f in NUMERICS_FIELDS
                 if f'numerics.requested.{f}' in frame.columns]


def run_deterministic(row):
  """(bool, why): does this run repeat bit-for-bit for its seed (TPU, CPU, GPU with det. ops)?"""
  for col in DET_COLUMNS:
    if col in row and not pd.isna(row[col]) and (col == 'deterministic' or row.get('platform') == 'gpu'):
      return bool(row[col]), f'{col}={bool(row[col])}'
  platform = row.get('platform')
  if platform in ('tpu', 'cpu'):
    return True, platform
  return False, f'platform {platform} without deterministic ops'


def label_columns(keys, names):
  """The group columns an arm label needs: in order, each one that splits the arms further."""
  chosen, distinct = [], 1
  for i, name in enumerate(names):
    count = len({tuple(k[j] for j in chosen + [i]) for k in keys})
    if count > distinct:
      chosen, distinct = chosen + [i], count
  return chosen or list(range(len(names)))


def arm_label(values, names, chosen):
  """'tpu, compute_dtype=bfloat16': the chosen group values, platform/device kind unnamed."""
  parts = []
  for i in chosen:
    short = names[i].rsplit('.', 1)[-1]
    parts.append(str(values[i]) if short in ('platform', 'device_kind') else f'{short}={values[i]}')
  return ', '.join(parts)


def prepare(frame, group_by, metric, seed_col='seed', scale=None, assume_deterministic=False):
  """Split the runs into included / excluded / duplicate rows and label each included run's arm.

  Returns a dict: `runs` (included rows with `arm`, `value` = metric × scale, `det`, `det_why`),
  `excluded` (run, status, reason), `duplicates` (arm, seed, kept, dropped, kept_value,
  dropped_value, same), `group_by`, `metric`, `scale`.
  """
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  metric = resolve_column(frame, metric, '--metric')
  group_by = [resolve_column(frame, g, '--group-by') for g in group_by] or default_group_by(frame)
  seed_col = resolve_column(frame, seed_col, '--seed-col')
  frame = frame.copy()
  status = frame['status'] if 'status' in frame else pd.Series('completed', index=frame.index)
  reason = frame['reason'] if 'reason' in frame else pd.Series('', index=frame.index)
  values = pd.to_numeric(frame[metric], errors='coerce')
  bad = status.ne('completed') | values.isna()
  progress = (f'step {a}/{b}' for a, b in zip(frame.get('step', [None] * len(frame)),
                                               frame.get('total_steps', [None] * len(frame))))
  why = [f'{s}: {r}' if s != 'completed' and isinstance(r, str) and r else
         f'{s}: {p}' if s != 'completed' else f'no value for {metric}'
         for s, r, p in zip(status, reason, progress)]
  excluded = pd.DataFrame({'run': frame['run'], 'status': status, 'reason': why})[bad]
  runs = frame[~bad].copy()
  if runs.empty:
    raise ValueError(f'--runs/--csv: none of the {len(frame)} runs is completed with a {metric}; '
                     'see the excluded list')
  if scale is None:
    scale = 100.0 if 'acc' in metric.lower() and values[~bad].abs().max() <= 1 else 1.0
  runs['value'] = values[~bad] * scale
  keys = runs[group_by].astype(str).apply(tuple, axis=1)
  chosen = label_columns(list(keys), group_by)
  runs['arm'] = [arm_label(k, group_by, chosen) for k in keys]
  dup = runs.duplicated(['arm', seed_col], keep='first')
  first = runs[~dup].set_index(['arm', seed_col])
  duplicates = pd.DataFrame([{
      'arm': r['arm'], 'seed': r[seed_col], 'kept': first.loc[(r['arm'], r[seed_col]), 'run'],
      'dropped': r['run'], 'kept_value': first.loc[(r['arm'], r[seed_col]), 'value'],
      'dropped_value': r['value'], 'same': first.loc[(r['arm'], r[seed_col]), 'value'] == r['value']}
      for _, r in runs[dup].iterrows()], columns=['arm', 'seed', 'kept', 'dropped', 'kept_value',
                                                  'dropped_value', 'same'])
  runs = runs[~dup].rename(columns={seed_col: 'seed'} if seed_col != 'seed' else {})
  det = [(True, 'assumed') if assume_deterministic else run_deterministic(r) for _, r in runs.iterrows()]
  runs['det'], runs['det_why'] = [d for d, _ in det], [w for _, w in det]
  return {'runs': runs, 'excluded': excluded.reset_index(drop=True), 'duplicates': duplicates,
          'group_by': group_by, 'metric': metric, 'scale': scale}


def bca_ci(x, level=0.95):
  """95% BCa bootstrap CI of the mean (scipy.stats.bootstrap, fixed rng); NaN when undefined."""
  x = np.asarray(x, float)
  if len(x) < 2:
    return np.nan, np.nan
  if np.ptp(x) == 0:
    return x[0], x[0]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    res = sps.bootstrap((x,), np.mean, confidence_level=level, method='BCa',
                        n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(BOOTSTRAP_SEED))
  return res.confidence_interval.low, res.confidence_interval.high


def seed_key(seed):
  """Sort seeds numerically when they are numbers, else as text."""
  try:
    return (0, float(seed), '')
  except (TypeError, ValueError):
    return (1, 0.0, str(seed))


def arm_table(prep):
  """One row per arm: arm, group fields, n, mean, sd, ci_low, ci_high (95% BCa), deterministic,
  determinism (why), seeds. Arms sorted by label."""
  rows = []
  dups = prep['duplicates']
  for arm, runs in prep['runs'].groupby('arm', sort=True):
    x = runs['value'].to_numpy()
    clash = dups[(dups['arm'] == arm) & ~dups['same'].astype(bool)]
    det = bool(runs['det'].all()) and clash.empty
    why = (f'seed {clash["seed"].iloc[0]} repeated with a different value' if not clash.empty
           else '; '.join(sorted(set(runs['det_why']))))
    low, high = bca_ci(x)
    rows.append({'arm': arm, **{g: runs[g].iloc[0] for g in prep['group_by']}, 'n': len(x),
                 'mean': x.mean(), 'sd': x.std(ddof=1) if len(x) > 1 else np.nan,
                 'ci_low': low, 'ci_high': high, 'deterministic': det, 'determinism': why,
                 'seeds': ' '.join(str(s) for s in sorted(runs['seed'], key=seed_key))})
  return pd.DataFrame(rows)


def welch(a, b):
  """(t, df, p): two-sided Welch t-test of mean(a) - mean(b)."""
  r = sps.ttest_ind(a, b, equal_var=False)
  return r.statistic, r.df, r.pvalue


def tost(diff, se, df, margin):
  """(ci90_low, ci90_high, p): TOST of |true difference| < margin for an estimate with t errors."""
  if se == 0:
    return diff, diff, (0.0 if abs(diff) < margin else 1.0)
  half = sps.t.ppf(1 - ALPHA, df) * se
  p_low = sps.t.sf((diff + margin) / se, df)
  p_high = sps.t.cdf((diff - margin) / se, df)
  return diff - half, diff + half, max(p_low, p_high)


def tost_ind(a, b, margin):
  """Welch TOST (unequal variances, Welch–Satterthwaite df): (ci90_low, ci90_high, p)."""
  va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
  se = np.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se > 0 else np.inf
  return tost(np.mean(a) - np.mean(b), se, df, margin)


def tost_paired(d, margin):
  """Paired TOST on per-seed differences d: (ci90_low, ci90_high, p)."""
  return tost(np.mean(d), np.std(d, ddof=1) / np.sqrt(len(d)), len(d) - 1, margin)


def hedges_g(a, b):
  """Bias-corrected standardised mean difference (mean(a) - mean(b)) / pooled sd × J."""
  na, nb = len(a), len(b)
  sp = np.sqrt(((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2))
  if sp == 0:
    return np.nan
  return (np.mean(a) - np.mean(b)) / sp * (1 - 3 / (4 * (na + nb) - 9))


def holm(pvalues):
  """Holm step-down adjusted p-values; NaN entries stay NaN and do not count as tests."""
  p = np.asarray(pvalues, float)
  out = np.full_like(p, np.nan)
  idx = np.flatnonzero(~np.isnan(p))
  order = idx[np.argsort(p[idx], kind='stable')]
  m, running = len(order), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out


def smallest_n(power_at, target):
  """Smallest integer n >= 2 with power_at(n) >= target (doubling, then bisection)."""
  if power_at(2) >= target:
    return 2
  low, high = 2, 4
  while power_at(high) < target:
    low, high = high, high * 2
    if high > 10 ** 7:
      return np.inf
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if power_at(mid) < target else (low, mid)
  return high


def seeds_needed(sd, margin, paired=False):
  """(n for 80% power to detect a difference of `margin`, n for 80% power to show equivalence
  within ±margin when the true difference is 0); per arm (pairs when paired); α = 0.05.

  statsmodels TTestIndPower (TTestPower when paired); equivalence uses the usual TOST
  approximation: one-sided test at α with power 1 − (1 − 0.8) / 2 against the margin.
  """
  if not sd > 0:
    return 2, 2
  solver = smp.TTestPower() if paired else smp.TTestIndPower()
  es = margin / sd
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    diff = smallest_n(lambda n: solver.power(es, n, ALPHA), POWER)
    equiv = smallest_n(lambda n: solver.power(es, n, ALPHA, alternative='larger'),
                       1 - (1 - POWER) / 2)
  return diff, equiv


def compare(runs_a, runs_b, det_a, det_b, margin):
  """Every test of one pair of arms (dicts of the columns of pair_table)."""
  a, b = runs_a['value'].to_numpy(), runs_b['value'].to_numpy()
  t, df, p = welch(a, b)
  shared = sorted(set(runs_a['seed']) & set(runs_b['seed']), key=seed_key)
  paired = det_a and det_b and len(shared) >= 2
  why = (f'paired: {len(shared)} shared seeds, both deterministic' if paired else
         f'unpaired: {len(shared)} shared seeds' + ('' if det_a and det_b else ', not both deterministic'))
  row = {'diff': a.mean() - b.mean(), 'welch_t': t, 'welch_df': df, 'welch_p': p,
         'paired': paired, 'design': why, 'n_pairs': len(shared) if paired else 0,
         'paired_t': np.nan, 'paired_p': np.nan,
         'mw_u': np.nan, 'mw_p': np.nan, 'hedges_g': hedges_g(a, b)}
  mw = sps.mannwhitneyu(a, b, alternative='two-sided', method='exact')
  row['mw_u'], row['mw_p'] = mw.statistic, mw.pvalue
  sp = np.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))
  row['n80_diff'], row['n80_equiv'] = seeds_needed(sp, margin)
  if paired:
    xa = runs_a.set_index('seed').loc[shared, 'value'].to_numpy()
    xb = runs_b.set_index('seed').loc[shared, 'value'].to_numpy()
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      r = sps.ttest_rel(xa, xb)
    row['paired_t'], row['paired_p'] = r.statistic, r.pvalue
    row['ci90_low'], row['ci90_high'], row['tost_p'] = tost_paired(xa - xb, margin)
    row['n80_pairs_diff'], row['n80_pairs_equiv'] = seeds_needed(np.std(xa - xb, ddof=1), margin, True)
  else:
    row['ci90_low'], row['ci90_high'], row['tost_p'] = tost_ind(a, b, margin)
    row['n80_pairs_diff'] = row['n80_pairs_equiv'] = np.nan
  row['equivalent'] = bool(-margin < row['ci90_low'] and row['ci90_high'] < margin)
  return row


def pair_table(prep, arms, margin):
  """One row per pair of arms with n >= 2 (arm_a before arm_b; diff = mean_a - mean_b), with
  Welch, paired t (when paired), TOST (paired or Welch; `equivalent`: 90% CI inside ±margin),
  exact Mann–Whitney, Hedges' g, seeds for 80% power, and Holm-adjusted p-values (`*_p_holm`)."""
  ok = arms[arms['n'] >= 2]
  runs = dict(tuple(prep['runs'].groupby('arm')))
  det = dict(zip(arms['arm'], arms['deterministic']))
  rows = [{'arm_a': a, 'arm_b': b, 'n_a': len(runs[a]), 'n_b': len(runs[b]),
           **compare(runs[a], runs[b], det[a], det[b], margin)}
          for a, b in itertools.combinations(ok['arm'], 2)]
  pairs = pd.DataFrame(rows)
  for test in ('welch', 'paired', 'tost', 'mw'):
    if not pairs.empty:
      pairs[f'{test}_p_holm'] = holm(pairs[f'{test}_p'])
  return pairs


def analyse(frame, group_by=(), metric=DEFAULT_METRIC, margin=0.5, seed_col='seed', scale=None,
            assume_deterministic=False):
  """Everything the report shows: prepare()'s dict plus `arms`, `pairs`, `small` (arms n < 2),
  `margin`."""
  if not margin > 0:
    raise ValueError(f'--margin: must be a positive number of percentage points, got {margin}')
  prep = prepare(frame, list(group_by), metric, seed_col, scale, assume_deterministic)
  arms = arm_table(prep)
  prep.update(arms=arms, pairs=pair_table(prep, arms, margin), small=arms[arms['n'] < 2],
              margin=margin)
  return prep


def read_csv(path):
  """A CSV of published results as a runs table (`run` = 'FILE:ROW' when it has no run column)."""
  try:
    frame = pd.read_csv(path)
  except (OSError, pd.errors.ParserError) as e:
    raise ValueError(f'--csv: cannot read {path} ({e}); give a CSV file with a header row')
  if 'run' not in frame:
    frame.insert(0, 'run', [f'{path}:{i + 2}' for i in range(len(frame))])
  return frame


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.stats', description=__doc__.split('\n')[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument('--runs', help='root holding the runs (local or gs://)')
  src.add_argument('--csv', help='a CSV of results, one row per run')
  p.add_argument('--group-by', nargs='+', default=[], help='columns defining an arm')
  p.add_argument('--metric', default=DEFAULT_METRIC)
  p.add_argument('--margin', type=float, default=0.5, help='equivalence margin, pp')
  p.add_argument('--seed-col', default='seed')
  p.add_argument('--scale', type=float, default=None,
                 help='multiply the metric by this (default: 100 for accuracies in [0, 1])')
  p.add_argument('--assume-deterministic', action='store_true',
                 help='treat every run as deterministic (for CSVs without platform facts)')
  p.add_argument('--format', choices=('md', 'latex', 'csv'), default='md')
  p.add_argument('--out', help='write here (csv: FILE_arms.csv, FILE_pairs.csv, ...) not stdout')
  return p.parse_args(argv)


def main(argv=None):
  from analysis import results, style  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  try:
    frame = results.load_runs(args.runs) if args.runs else read_csv(args.csv)
    out = analyse(frame, args.group_by, args.metric, args.margin, args.seed_col, args.scale,
                  args.assume_deterministic)
    out['source'] = args.runs or args.csv
    for arm in out['small']['arm']:
      print(f'warning: arm {arm!r} has n < 2 completed runs: reported, its tests skipped',
            file=sys.stderr)
    style.write_report(out, args.format, args.out)
  except ValueError as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  main()
