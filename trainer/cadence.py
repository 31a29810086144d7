"""What the training loop does after each step: one rule for the log, epoch, evaluation and
checkpoint cadence (`due`, in the spirit of big_vision's `itstime`), read by the loop
(trainer/loop.py) and by the sweep's estimates.
"""

import dataclasses

from trainer.run import Context


@dataclasses.dataclass(frozen=True)
class Due:
  """What happens after a step: `check` non-finite values, `log`, end the epoch (`epoch`),
  `evaluate` at that epoch's end, `save` a checkpoint."""

  check: bool
  log: bool
  epoch: bool
  evaluate: bool
  save: bool


def due(ctx: Context, step: int) -> Due:
  """What the loop does after global step `step` (1-based count of steps done): one rule for the
  log, epoch, evaluation and checkpoint cadence."""
  c = ctx.config
  epoch, in_epoch = divmod(step, ctx.per_epoch)
  epoch_end = in_epoch == 0
  log = step % c.log_every_steps == 0 or epoch_end
  save = bool(c.checkpoint_every_steps and step % c.checkpoint_every_steps == 0)
  evaluate_now = epoch_end and (epoch % c.eval_every_epochs == 0 or epoch == c.num_epochs)
  return Due(
    check=log or save, log=log, epoch=epoch_end, evaluate=evaluate_now, save=save or epoch_end
  )
