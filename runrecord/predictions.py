"""A run's per-example test predictions: what they hold, how they are written, how they are read.

Every evaluation of a run (trainer/run.py evaluate) gives, besides its accuracy and loss, the
outputs of every test example in test-set order; the training loop writes them as the Orbax item
`predictions` of the checkpoint step at which it evaluated, beside `results` (runrecord/record.py
owns the layout: <workdir>/checkpoints/<step>/{state, results, predictions}). A checkpoint step
without an evaluation (a mid-epoch one, a failed run's results-only step) has no such item, nor do
steps written before this item existed: they read as None.

The item (numpy arrays, test-set order, n = the test split's size exactly: the padding of the last
evaluation batch dropped), by the dataset's task:
  classification  label int32[n], predicted int32[n] (argmax of the logits), p_predicted and
                  p_label float32[n] (softmax probability of the predicted class, of the label)
  multilabel      label int8[n, K], predicted int8[n, K] (logit > 0), probability float32[n, K]
                  (sigmoid: the probability of 1); K = 40 for the CelebA attributes
and in both: `task` (the dataset's task, 'classification' | 'multilabel') and `fingerprint` (the
test split's fingerprint, data.split_fingerprint in the run's record): predictions of two runs
compare example by example only when their fingerprints are equal.

The outputs of each evaluation batch are replicated over the devices inside the jitted step (one
all-gather per batch), fetched to the host once at the end of the evaluation; every process then
holds the same arrays, and Orbax writes numpy leaves from process 0 only, asynchronously like the
rest of the step. A CelebA identity test split (~40k examples) takes ~0.6 MB, its attributes
split ~10 MB; the steps kept are bounded by config.keep_checkpoints. The evaluation is a function
of the state, so a resumed run writes the predictions an uninterrupted one writes, bit for bit.

  read_predictions(workdir)           # the newest step holding predictions, or None
  read_predictions(workdir, step=44)  # that step's, or None
"""

import logging
import os

import numpy as np

from runrecord import record

ITEM = 'predictions'
KEYS = {'classification': ('label', 'predicted', 'p_predicted', 'p_label'),
        'multilabel': ('label', 'predicted', 'probability')}


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
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel  (loads JAX: not at import)
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
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  absl_log = logging.getLogger('absl')  # Orbax warns three lines per read-only manager
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    options = ocp.CheckpointManagerOptions(read_only=True)
    with ocp.CheckpointManager(record.checkpoint_dir(workdir), item_names=(ITEM,),
                               options=options) as mngr:
      restored = mngr.restore(step, args=ocp.args.Composite(**{ITEM: ocp.args.PyTreeRestore()}))
  finally:
    absl_log.setLevel(level)
  return {**dict(restored[ITEM]), 'step': int(step)}
