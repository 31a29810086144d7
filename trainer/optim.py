"""AdamW, the warmup-cosine schedule, and the frozen-backbone phase.

Two phases: for the first `optim.freeze_epochs` only the parts named in `model.reinit` (by default
the stem and the head) train and every other parameter stays bit-identical; then all train.
BatchNorm running statistics keep updating while frozen, as in the reference (train-mode BN).

`optim.schedule`:
  'per_phase'  (the reference): each phase gets a fresh AdamW state and its own warmup-cosine
               (warmup `warmup_epochs`, cosine to 0 at the end of the phase).
  'continuous': one AdamW state and one warmup-cosine over all epochs; the backbone's Adam moments
               start at zero when it unfreezes.
See docs/celeba.md ("Task and split") and docs/configs.md ("Field groups").
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax

from models import architecture


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, stop) trained with `frozen` (backbone fixed) and a schedule over `length`."""

  name: str
  start: int
  stop: int
  frozen: bool
  schedule_start: int  # the optimizer step count at `start` is step - schedule_start
  schedule_length: int


def phases(config: ml_collections.ConfigDict, steps_per_epoch: int) -> list[Phase]:
  """The run's phases, in order (one or two): a 'frozen' one first when optim.freeze_epochs is
  set, then 'full'; together they cover steps [0, num_epochs * steps_per_epoch)."""
  total = config.num_epochs * steps_per_epoch
  freeze = config.optim.freeze_epochs * steps_per_epoch
  if config.optim.schedule == 'continuous':
    out = [Phase('frozen', 0, freeze, True, 0, total)] if freeze else []
    return out + [Phase('full', freeze, total, False, 0, total)]
  out = [Phase('frozen', 0, freeze, True, 0, freeze)] if freeze else []
  return out + [Phase('full', freeze, total, False, freeze, total - freeze)]


def phase_at(all_phases: Sequence[Phase], step: int) -> Phase:
  """The phase of `all_phases` holding global `step` (the last one past their end)."""
  for phase in all_phases:
    if phase.start <= step < phase.stop:
      return phase
  return all_phases[-1]


def warmup_cosine(config, steps_per_epoch, length):
  """optax schedule: linear 0 -> lr over warmup, cosine lr -> 0 at `length` steps."""
  warmup = int(round(config.optim.warmup_epochs * steps_per_epoch))
  warmup = max(0, min(warmup, length - 1))
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.optim.learning_rate,
    warmup_steps=warmup,
    decay_steps=max(length, 1),
    end_value=0.0,
  )


def learning_rate(config, steps_per_epoch, all_phases, step):
  """The learning rate used by global step `step` (the same number the optimizer computes): the
  optimizer's own schedule evaluated on the host for the log; not optax.inject_hyperparams, which
  puts the rate into the optimizer state (every checkpoint) only for the log to read it back."""
  phase = phase_at(all_phases, step)
  schedule = warmup_cosine(config, steps_per_epoch, phase.schedule_length)
  return float(schedule(step - phase.schedule_start))


def make_optimizer(config, steps_per_epoch, phase):
  """AdamW (decoupled weight decay scaled by the lr, as torch.optim.AdamW) for `phase`."""
  o = config.optim
  return optax.adamw(
    warmup_cosine(config, steps_per_epoch, phase.schedule_length),
    b1=o.b1,
    b2=o.b2,
    eps=o.eps,
    weight_decay=o.weight_decay,
  )


def trainable_mask(params, frozen, reinit):
  """Pytree of Python bools like `params`: True where the parameter trains in this phase."""
  names = {name for part in reinit for name in architecture.PARTS[part]}
  return {
    key: jax.tree.map(lambda _, k=key: (not frozen) or k in names, value)
    for key, value in params.items()
  }


def masked_update(params, grads, opt_state, tx, mask):
  """One optimizer step touching only the parameters where `mask` is True.

  Frozen parameters get zero gradients (so XLA drops their weight-gradient computation) and are
  returned as the very same arrays, bit-identical. Not optax.multi_transform with set_to_zero: its
  state's tree changes at the unfreeze, and the loop restores every checkpoint into the first
  phase's state (trainer/loop.py `_start`; tests/test_mesh_and_optimizer.py).
  """
  grads = jax.tree.map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = jax.tree.map(lambda p, u, m: p + u.astype(p.dtype) if m else p, params, updates, mask)
  return params, opt_state
