"""Planted inputs of the hostile-analysis tests (tests/integration/test_hostile_*.py)."""

import numpy as np
import pandas as pd

from runrecord import record

METRIC = record.DEFAULT_METRIC


# 2. A CSV is checked before anything is computed.


def accuracy_csv(path, values, seeds=None, runs=None, status=None):
  """A CSV of two arms (platform a/b alternating) with the given accuracies."""
  n = len(values)
  table = {
    'run': runs or [f'r{i}' for i in range(n)],
    'platform': ['a', 'b'] * (n // 2) + ['a'] * (n % 2),
    'seed': seeds if seeds is not None else [i // 2 for i in range(n)],
    'accuracy': values,
  }
  if status:
    table['status'] = status
  pd.DataFrame(table).to_csv(path, index=False)
  return str(path)


def fractions(n=12):
  return list(0.80 + 0.001 * np.arange(n))
