"""A run's per-example test predictions: the Orbax item of each evaluation's checkpoint step, and
its reading. docs/record.md, "Test predictions"."""

import logging
import os

import numpy as np

from runrecord import record

ITEM = 'predictions'
KEYS = {
  'classification': ('label', 'predicted', 'p_predicted', 'p_label'),
  'multilabel': ('label', 'predicted', 'probability'),
}


def collect(dataset, outputs):
  """The predictions item of one evaluation of `dataset`'s test split from the eval outputs."""
  n, task = len(dataset.test), dataset.task
  arrays = {key: np.concatenate([o[key] for o in outputs])[:n] for key in outputs[0]}
  arrays['label'] = np.asarray(dataset.test.labels)
  labels = np.int32 if task == 'classification' else np.int8  # multilabel: bits
  item = {
    key: arrays[key].astype(labels if key in ('label', 'predicted') else np.float32)
    for key in KEYS[task]
  }
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
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / ITEM).exists())


def read_predictions(workdir, step=None):
  """The predictions (with task, fingerprint, step) at `step` of `workdir` (None: newest)."""
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
