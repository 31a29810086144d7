"""Planted inputs of the statistics tests (tests/unit/test_stats*.py): arms of planted accuracies
as a runs table, and the published H100 + CPU values."""

import io

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as sps

from analysis import report
from runrecord import record

METRIC = 'final.test_accuracy'


def frame(arms, platforms=None, deterministic=None):
  """A runs table: arms = {dtype: [accuracy fraction per seed 0..n-1]}; deterministic = {dtype:
  bool} sets the recorded GPU determinism (runrecord.record.DETERMINISM_COLUMN)."""
  rows = []
  for dtype, values in arms.items():
    platform = (platforms or {}).get(dtype, 'tpu')
    for seed, value in enumerate(values):
      row = {
        'run': f'/r/{dtype}/{seed:03d}',
        'status': 'completed',
        'reason': '',
        'seed': seed,
        'platform': platform,
        'numerics.requested.compute_dtype': dtype,
        METRIC: value,
      }
      if deterministic is not None:
        row[record.DETERMINISM_COLUMN] = deterministic.get(dtype, False)
      rows.append(row)
  return pd.DataFrame(rows)


PUB_SEEDS = [42, 42, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10]  # per platform; 42 and 3 run twice


def published_values():
  """(tpu, gpu): 14 accuracies each (fractions, in PUB_SEEDS order) whose means, sds and Welch p
  are the published ones to 4 decimals: TPU 0.6979 (sd 0.0090), GPU 0.6937 (sd 0.0065), p 0.1734.

  The shapes are fixed normal quantiles (TPU repeats seeds 42 and 3 bit for bit, GPU does not);
  the means move inside their rounding interval until Welch's p is 0.1734.
  """
  order = np.random.default_rng(14).permutation
  z_tpu = sps.norm.ppf((np.arange(12) + 0.5) / 12)[order(12)][
    [0, 0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11]
  ]
  z_gpu = sps.norm.ppf((np.arange(14) + 0.5) / 14)[order(14)]

  def unit(z):
    return (z - z.mean()) / z.std(ddof=1)

  def build(s):
    return (0.6979 - s * 4.9e-5 + 0.0090 * unit(z_tpu), 0.6937 + s * 4.9e-5 + 0.0065 * unit(z_gpu))

  s = optimize.brentq(lambda s: sps.ttest_ind(*build(s), equal_var=False).pvalue - 0.1734, 0, 1)
  return build(s)


def write_published(path, with_seeds):
  tpu, gpu = published_values()
  table = {'platform': ['tpu'] * 14 + ['gpu'] * 14, 'accuracy': np.concatenate([tpu, gpu])}
  if with_seeds:
    table = {'platform': table['platform'], 'seed': PUB_SEEDS * 2, 'accuracy': table['accuracy']}
  pd.DataFrame(table).to_csv(path, index=False)
  return tpu, gpu


def csv_tables(text):
  """{table: DataFrame} of what `--format csv` prints ('# name' then the CSV, per table)."""
  blocks = [b for b in text.split('# ') if b.strip()]
  return {b.split('\n', 1)[0]: pd.read_csv(io.StringIO(b.split('\n', 1)[1])) for b in blocks}


def why(pair, margin, m=1):
  """The report's words for a judged pair (analysis/report.py): stats keeps numbers only."""
  return report.verdict_why(pair, margin, 'pp', m)
