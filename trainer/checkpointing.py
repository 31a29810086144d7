"""Orbax checkpoints: the training state and the run's `results` (JSON) in one manager.

Layout: <workdir>/checkpoints/<step>/{state, results}. Every save carries the results as they
stand (status 'running' until the last save, then 'completed' or 'failed'), so the latest step's
`results` is always the run's current record, readable without the state (analysis/results.py).
"""

import jax
import orbax.checkpoint as ocp
from etils import epath

ITEMS = ('state', 'results')


def checkpoint_dir(workdir):
  return epath.Path(workdir) / 'checkpoints'


def manager(workdir, keep, async_save=True):
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options, item_names=ITEMS)


def save(mngr, step, state, results):
  """Save (asynchronously, where enabled) the state and the results at `step`."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          results=ocp.args.JsonSave(results)), force=True)


def restore(mngr, step, abstract_state):
  """(state, results) at `step`; `abstract_state` gives structure, dtypes and shardings."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), results=ocp.args.JsonRestore()))
  return restored['state'], restored['results']


def restore_results(mngr, step):
  return mngr.restore(step, args=ocp.args.Composite(results=ocp.args.JsonRestore()))['results']


def abstract(state):
  """ShapeDtypeStructs (with shardings) describing `state`, for restoring into the same layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
