"""Runs tables planted without runs (the frame analysis.inputs reads from run folders or a
CSV): two arms per platform, the digits study's 8 arms, a small CSV."""

import os

import numpy as np
import pandas as pd

from analysis import declaration
from configs import digits
from runrecord import record

METRIC = record.DEFAULT_METRIC


def table(platforms=('cpu', 'gpu'), seeds=range(6), percent=False, rng=0):
  """Two arms (float32, bfloat16) per platform, one run per seed; accuracy, train loss and the
  data facts a digits run records."""
  rng = np.random.default_rng(rng)
  rows = []
  for platform in platforms:
    for dtype in ('float32', 'bfloat16'):
      for seed in seeds:
        acc = 0.95 + 0.004 * (dtype == 'bfloat16') + rng.normal(0, 0.005)
        rows.append(
          {
            'run': f'{platform}/{dtype}/s{seed}',
            'run_id': f'{platform}-{dtype}-{seed}',
            'status': 'completed',
            'seed': seed,
            'platform': platform,
            'numerics.requested.compute_dtype': dtype,
            'config.data.split_seed': 42,
            'data.split_fingerprint': 'f00d',
            'data.test_size': 360,
            METRIC: 100 * acc if percent else acc,
            'final.train_loss': 0.1 + 0.01 * seed,
          }
        )
  return pd.DataFrame(rows)


def write_study(root, declared):
  """The declaration as the study.json sweeps.sweep writes into a root; its path."""
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, declaration.STUDY_FILE)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(declaration.dumps(declared))
  return path


def write(frame, tmp_path, name='runs.csv'):
  path = tmp_path / name
  frame.to_csv(path, index=False)
  return str(path)


DIGITS = declaration.load('configs/digits.py:study')


def digits_frame(platforms=('cpu',), seeds=range(6), rng=0):
  """Runs of the digits fraction's 8 arms (configs/digits.py study_arms) on each platform."""
  rng = np.random.default_rng(rng)
  rows = []
  for platform in platforms:
    for k, arm in enumerate(digits.study_arms(128)):
      for seed in seeds:
        rows.append(
          {
            'run': f'/r/{platform}/{k}/{seed}',
            'status': 'completed',
            'seed': seed,
            'platform': platform,
            'device_kind': platform,
            **{f'numerics.requested.{f.split(".")[1]}': v for f, v in arm.items()},
            METRIC: (95 + 0.2 * k + rng.normal(0, 0.8)) / 100,
            'versions.jax': {'cpu': '0.10.2', 'gpu': '0.11.2'}[platform],
            'versions.optax': '0.2.8',
          }
        )
  return pd.DataFrame(rows)


def runs_csv(path, shift=0.0):
  rng = np.random.default_rng(1)
  rows = [
    {
      'run': f'{p}/{d}/{s}',
      'platform': p,
      'seed': s,
      'numerics.requested.compute_dtype': d,
      METRIC: 0.9 + shift + 0.01 * (d == 'bfloat16') + rng.normal(0, 0.004),
      'final.train_loss': 0.1,
    }
    for p in ('cpu', 'gpu')
    for d in ('float32', 'bfloat16')
    for s in range(4)
  ]
  pd.DataFrame(rows).to_csv(path, index=False)
  return str(path)
