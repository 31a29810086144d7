"""A run's per-example test predictions: the Orbax item `predictions` of each evaluation's
checkpoint step (collect, save_items), and its reading (saved_steps, read_predictions). What the
item holds, per task, and when two runs' predictions compare: docs/record.md "Test predictions"."""

import logging
import os

import numpy as np

from runrecord import record

ITEM = 'predictions'
KEYS = {
  'classification': ('label', 'predicted', 'p_predicted', 'p_label'),
  'multilabel': ('label', 'predicted', 'probability'),
}


def dtype(key, task):
  """The saved dtype of array `key`: labels and predictions int32 (classes) or int8 (bits),
  probabilities float32."""
  if key in ('label', 'predicted'):
    return np.int32 if task == 'classification' else np.int8
  return np.float32


def collect(dataset, outputs):
  """The predictions item of one evaluation of `dataset`'s test split from `outputs`, the eval
  step's per-batch outputs (host numpy dicts, in batch order, the last batch padded)."""
  n, task = len(dataset.test), dataset.task
  arrays = {key: np.concatenate([o[key] for o in outputs])[:n] for key in outputs[0]}
  arrays['label'] = np.asarray(dataset.test.labels)
  item = {key: arrays[key].astype(dtype(key, task)) for key in KEYS[task]}
  return {**item, 'task': task, 'fingerprint': str(dataset.info.get('split_fingerprint', ''))}


def save_items(predictions):
  """{item name: Orbax save argument} for runrecord/record.py save: nothing when None."""
  import orbax.checkpoint as ocp  # loads JAX: not at import

  return {} if predictions is None else {ITEM: ocp.args.PyTreeSave(predictions)}


def saved_steps(workdir):
  """The checkpoint steps of `workdir` that hold a predictions item, oldest first."""
  folder = record.checkpoint_dir(workdir)
  if not folder.exists():
    return []
  steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / ITEM).exists()]
  return sorted(steps)


def read_predictions(workdir, step=None):
  """The predictions item saved at checkpoint `step` of run folder `workdir` (None: the newest
  step holding one) as a dict of numpy arrays, `task`, `fingerprint` and `step`; None when that
  step (or every step) has none. Needs neither the model nor the training state."""
  workdir = workdir if '://' in str(workdir) else os.path.abspath(workdir)  # Orbax: absolute
  steps = saved_steps(workdir)
  if step is None:
    step = steps[-1] if steps else None
  if step not in steps:
    return None
  import orbax.checkpoint as ocp

  absl_log = logging.getLogger('absl')  # Orbax warns three lines per read-only manager
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    options = ocp.CheckpointManagerOptions(read_only=True)
    with ocp.CheckpointManager(
      record.checkpoint_dir(workdir), item_names=(ITEM,), options=options
    ) as mngr:
      restored = mngr.restore(step, args=ocp.args.Composite(**{ITEM: ocp.args.PyTreeRestore()}))
  finally:
    absl_log.setLevel(level)
  return {**dict(restored[ITEM]), 'step': int(step)}
