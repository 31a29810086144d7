"""What an existing workdir means for this run: start, resume, refuse, or (--restart) start over.

Refuses, before any compute: a failed run; a run with another config, data or platform identity
(runrecord/record.py says what "the same run" is); an unfinished run on another device layout
unless `allow_layout_change`, whose segments the results then list. See docs/operations.md
(resuming: what is checked).
"""

import jax
from absl import logging

from configs import validation
from runrecord import record, rules, sessions
from trainer import checkpointing, distributed


def sync(name):
  distributed.barrier(name)


def _shown(diffs):
  return '; '.join(diffs[:4]) + (f'; and {len(diffs) - 4} more' if len(diffs) > 4 else '')


def check_workdir_run(
  mngr, workdir, config, restart, data=None, facts=None, allow_layout_change=False
):
  """Refuse, or wipe (restart), per the module docstring. Returns the manager to use.

  `data`: this run's record.data_facts; `facts`: trainer/execution.py facts() (None: not
  compared).
  """
  step, saved = checkpointing.latest_results(mngr)
  if restart and mngr.all_steps():
    logging.warning('--restart: discarding the run in %s (latest step %s)', workdir, step)
    mngr.close()
    sync('restart_read')
    if jax.process_index() == 0:
      checkpointing.wipe(workdir)
    sync('restart_wiped')
    return checkpointing.manager(workdir, config.keep_checkpoints)
  if saved is None:
    return mngr
  if saved.get('status') == 'failed':
    raise validation.ConfigError(
      f'workdir {workdir} holds a run that failed at step {saved.get("failed_step", step)} '
      f'({saved.get("reason", "no reason recorded")}); pass --restart to discard it and start '
      'over, or use another --workdir'
    )
  diffs = sessions.config_differences(saved.get('config'), config.to_dict())
  if diffs:
    raise validation.ConfigError(
      f'workdir {workdir} holds a run with a different config ({_shown(diffs)}): pass --restart '
      'to discard it and start over, or use another --workdir'
    )
  diffs = sessions.data_differences(saved.get('data'), data)
  if diffs:
    raise validation.ConfigError(
      f'workdir {workdir} holds a run trained on other data ({_shown(diffs)}): to resume it, '
      'point config.data (manual_dir, tfds_dir, cache_dir) at the data it was trained on; to '
      'train on this data, use another --workdir'
    )
  unfinished = facts and saved.get('status') != 'completed'
  moved = sessions.identity_differences(saved, facts) if unfinished else []
  if moved and not allow_layout_change:
    raise validation.ConfigError(
      f'workdir {workdir} holds a run saved at step {step} on another platform identity '
      f'({_shown(moved)}; the analysis groups runs by it): resume it where it ran (the same '
      'XLA_FLAGS and instruction set), or pass --allow_layout_change to continue here as a run '
      f'of its own platform ({rules.platform_identity(saved)}+{rules.platform_identity(facts)})'
    )
  diffs = (sessions.layout_differences(saved, facts) if unfinished else []) + moved
  if diffs and not allow_layout_change:
    raise validation.ConfigError(
      f'workdir {workdir} holds a run saved at step {step} on another device layout '
      f'({_shown(diffs)}): resume it on the same devices and processes, or pass '
      '--allow_layout_change to continue on these (the results then record each segment)'
    )
  if diffs:
    logging.warning(
      'Continuing the run of %s on another device layout (%s): the results record each segment',
      workdir,
      _shown(diffs),
    )
  return mngr


def restore(mngr, workdir, abstract_state, keep):
  """(mngr, step, state, saved results) from the newest valid step; damaged newer ones set aside.

  Returns step None when the workdir holds no step. Raises ConfigError when steps exist but none
  restores.
  """
  if not mngr.all_steps():
    return mngr, None, None, None
  step, state, saved, bad = checkpointing.restore_newest_valid(mngr, abstract_state)
  if step is None:
    raise validation.ConfigError(
      f'no checkpoint in {record.checkpoint_dir(workdir)} can be restored (steps '
      f'{sorted(bad)} are damaged): pass --restart to start over, or use another --workdir'
    )
  if bad:
    logging.warning(
      'Resuming from step %d: newer checkpoint steps %s are damaged and are moved to %s/%s',
      step,
      sorted(bad),
      workdir,
      checkpointing.CORRUPT_DIR,
    )
    mngr.close()
    sync('corrupt_read')
    if jax.process_index() == 0:
      checkpointing.set_aside(workdir, bad)
    sync('corrupt_moved')
    mngr = checkpointing.manager(workdir, keep)
  return mngr, step, state, saved
