"""What an existing workdir means for this run: start, resume, refuse, or (--restart) start over.

Checked before any compute (after the config and the dataset, with the workdir locked):
- a workdir whose latest results say `failed` (e.g. NaN loss) refuses: the same command would fail
  the same way; `--restart` discards that run;
- a workdir holding a run with a different config refuses, naming the fields; `--restart` discards
  it. "The same run" is trainer/record.py's rule (`config_differences`): fields that cannot change
  the run's arithmetic (where the data files live, logging and checkpoint cadence, ...) may differ.
"""

import jax
from absl import logging
from trainer import checkpointing, distributed, record, validation


def sync(name):
  distributed.barrier(name)


def check_workdir_run(mngr, workdir, config, restart):
  """Refuse, or wipe (restart), per the module docstring. Returns the manager to use."""
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
        'over, or use another --workdir')
  diffs = record.config_differences(saved.get('config'), config.to_dict())
  if diffs:
    shown = '; '.join(diffs[:4]) + (f'; and {len(diffs) - 4} more' if len(diffs) > 4 else '')
    raise validation.ConfigError(
        f'workdir {workdir} holds a run with a different config ({shown}): pass --restart to '
        'discard it and start over, or use another --workdir')
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
        f'{sorted(bad)} are damaged): pass --restart to start over, or use another --workdir')
  if bad:
    logging.warning('Resuming from step %d: newer checkpoint steps %s are damaged and are moved '
                    'to %s/%s', step, sorted(bad), workdir, checkpointing.CORRUPT_DIR)
    mngr.close()
    sync('corrupt_read')
    if jax.process_index() == 0:
      checkpointing.set_aside(workdir, bad)
    sync('corrupt_moved')
    mngr = checkpointing.manager(workdir, keep)
  return mngr, step, state, saved
