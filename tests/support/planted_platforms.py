"""Runs tables of the platform-gap designs: every platform runs native and the profile emulating
each platform, cell by cell shifted as a test asks (values in percentage points)."""

import numpy as np
import pandas as pd

METRIC = 'final.test_accuracy'
PROFILE = 'numerics.requested.profile'


EMULATES = {'tpu': 'tpu_default', 'gpu': 'jax_gpu_default', 'cpu': 'f32'}
DECLARED = {
  'factors': ['platform', 'profile'],
  'reference': {'profile': 'native'},
  'native': {'profile': 'native'},
  'platform_profile': EMULATES,
  'margin': 2.0,
  'margin_reason': 'planted',
  'labels': {'profile': '{}'},
}


def table(cells, seeds):
  """The raw runs table of {(platform, profile): value per seed (pp)}."""
  return pd.DataFrame(
    [
      {
        'run': f'/r/{p}/{e}/{s}',
        'status': 'completed',
        'seed': s,
        'platform': p,
        PROFILE: e,
        METRIC: v / 100,
      }
      for (p, e), values in cells.items()
      for s, v in zip(seeds, values, strict=True)
    ]
  )


def planted(shift, platforms=('tpu', 'gpu', 'cpu'), seeds=10, rng=0, sd=0.3):
  """Every platform runs native and the profiles emulating each platform: value = 90 + seed effect
  + shift[(platform, profile)] + noise."""
  rng = np.random.default_rng(rng)
  base = 90 + rng.normal(0, 1.0, seeds)
  profiles = ['native'] + [EMULATES[p] for p in platforms]
  cells = {
    (p, e): base + shift.get((p, e), 0.0) + rng.normal(0, sd, seeds)
    for p in platforms
    for e in profiles
  }
  return table(cells, range(seeds))


THREE = {
  ('tpu', 'native'): 1.2,
  ('gpu', 'native'): 2.4,
  ('tpu', 'tpu_default'): 0.8,
  ('gpu', 'tpu_default'): 0.8,
  ('cpu', 'tpu_default'): 0.8,
  ('tpu', 'jax_gpu_default'): 0.3,
  ('gpu', 'jax_gpu_default'): 0.3,
  ('cpu', 'jax_gpu_default'): 0.3,
}
