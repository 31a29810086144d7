"""Fault injection for the reliability tests, from the test side:
`TRAIN_FAULT=<action>@<point>:<n>[,...]`.

Points: `step` (right after train step n is dispatched, before what is due after it), `save`
(the checkpoint write of step n: `enospc` fails the write before it starts; `kill`, `term` and
`int` fire once the write is dispatched, while Orbax writes asynchronously), `eval` (after each
batch of the evaluation that ends epoch n). Actions: `kill` (SIGKILL this process: a preemption
without notice), `term` / `int` (SIGTERM / SIGINT to this process: a preemption notice, a time
limit, Ctrl-C), `hup` / `usr1` (an SSH session closing, SLURM's --signal warning), `enospc`
(raise OSError(ENOSPC): a full disk).

`install(spec, patch)` wraps the trainer's own functions (trainer.train._after_step, record.save,
train._end_epoch's evaluation step): nothing in the production code knows about faults. In a test
process pass pytest's `monkeypatch.setattr`; `python tests/support/fault_train.py ...` installs them
from TRAIN_FAULT in a train.py process.
"""

import errno
import os
import signal

from runrecord import record
from trainer import train

SIGNALS = {'kill': signal.SIGKILL, 'term': signal.SIGTERM, 'int': signal.SIGINT}
SIGNALS.update(hup=signal.SIGHUP, usr1=signal.SIGUSR1)
ACTIONS = tuple(SIGNALS) + ('enospc',)
POINTS = ('step', 'save', 'eval')


def parse(spec):
  """{(action, point, n)} of a TRAIN_FAULT value; ValueError naming a malformed item."""
  faults = set()
  for item in filter(None, (s.strip() for s in (spec or '').split(','))):
    action, _, rest = item.partition('@')
    where, _, n = rest.partition(':')
    if action not in ACTIONS or where not in POINTS or not n.isdigit():
      raise ValueError(
        f'TRAIN_FAULT: {item!r} is not <{"|".join(ACTIONS)}>@<{"|".join(POINTS)}>:<n>'
      )
    faults.add((action, where, int(n)))
  return faults


def fire(faults, where, n, actions=ACTIONS):
  """Do every fault among `actions` configured for (`where`, `n`)."""
  for action, at, k in sorted(faults):
    if at == where and k == n and action in actions:
      if action in SIGNALS:
        os.kill(os.getpid(), SIGNALS[action])
      else:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f'injected at {where} {n}')


def install(spec, patch=setattr):
  """Wrap the trainer's functions so that the faults of `spec` fire (module doc)."""

  faults = parse(spec)
  if not faults:
    return
  after_step, save, end_epoch = train._after_step, record.save, train._end_epoch

  def faulty_after_step(ctx, mngr, p, *args):
    fire(faults, 'step', p.step)
    return after_step(ctx, mngr, p, *args)

  def faulty_save(mngr, step, results, state=None, extra=None):
    fire(faults, 'save', step, ('enospc',))
    save(mngr, step, results, state, extra)
    fire(faults, 'save', step, tuple(SIGNALS))

  def faulty_end_epoch(ctx, p, eval_fn, evaluate_now):
    epoch = p.step // ctx.per_epoch

    def faulty_eval(*args):
      out = eval_fn(*args)
      fire(faults, 'eval', epoch)
      return out

    return end_epoch(ctx, p, faulty_eval, evaluate_now)

  patch(train, '_after_step', faulty_after_step)
  patch(record, 'save', faulty_save)
  patch(train, '_end_epoch', faulty_end_epoch)
