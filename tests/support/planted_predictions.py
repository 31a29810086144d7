"""Predictions dicts planted without a model: 400 images of 10 classes, a share of them moved to
another class (for the agreement, calibration and per-class sections)."""

import numpy as np

N, CLASSES, FINGERPRINT = 400, 10, 'e17be61d6f4e908a'
LABELS = np.random.default_rng(0).integers(0, CLASSES, N).astype(np.int32)


def prediction(flip, rng, base=None, fingerprint=FINGERPRINT):
  """A classification predictions dict: `base` (default the labels) with a share `flip` of the
  images moved to another class."""
  predicted = (LABELS if base is None else base).copy()
  moved = rng.random(N) < flip
  predicted[moved] = (predicted[moved] + 1 + rng.integers(0, CLASSES - 1, moved.sum())) % CLASSES
  p_pred = rng.uniform(0.3, 1.0, N).astype(np.float32)
  return {
    'label': LABELS,
    'predicted': predicted.astype(np.int32),
    'p_predicted': p_pred,
    'p_label': np.where(predicted == LABELS, p_pred, p_pred / 4).astype(np.float32),
    'fingerprint': fingerprint,
    'task': 'identity',
    'step': 10,
  }


def planted_loader(runs, rng):
  """{run: predictions}: seed s of every arm near a shared seed model, so pairs are comparable."""
  base = {s: prediction(0.05, rng) for s in runs['seed'].unique()}
  return {
    r: prediction(0.03, rng, base=base[s]['predicted'])
    for r, s in zip(runs['run'], runs['seed'], strict=True)
  }
