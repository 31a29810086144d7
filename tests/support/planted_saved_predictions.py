"""Predictions items as a digits run saves them (360 test images, 10 classes)."""

import numpy as np

N, FINGERPRINT, CLASSES = 360, 'ab12cd34ef56ab78', 10
LABELS = np.random.default_rng(0).integers(0, CLASSES, N).astype(np.int32)


def item(predicted):
  p = np.full(N, 0.9, np.float32)
  return {
    'label': LABELS,
    'predicted': predicted.astype(np.int32),
    'p_predicted': p,
    'p_label': np.where(predicted == LABELS, p, 0.01).astype(np.float32),
    'task': 'classification',
    'fingerprint': FINGERPRINT,
  }
