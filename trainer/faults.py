"""Fault injection for the reliability tests: `TRAIN_FAULT=<action>@<point>:<n>[,...]`.

Points: `step` (right after train step n is dispatched), `save` (inside the checkpoint write of step
n: `kill`, `term` and `int` fire while Orbax is writing, `enospc` fails the write before it starts),
`eval` (during the evaluation after epoch n). Actions: `kill` (SIGKILL this process: a
preemption without notice), `term` / `int` (SIGTERM / SIGINT to this process: a preemption notice,
a time limit, Ctrl-C), `enospc` (raise OSError(ENOSPC): a full disk). Unset in normal runs: then
`point` is a dictionary lookup.
"""

import errno
import os
import signal

ENV = 'TRAIN_FAULT'
SIGNALS = {'kill': signal.SIGKILL, 'term': signal.SIGTERM, 'int': signal.SIGINT}


def _parse(spec):
  faults = set()
  for item in filter(None, (s.strip() for s in spec.split(','))):
    action, rest = item.split('@', 1)
    where, n = rest.split(':', 1)
    faults.add((action, where, int(n)))
  return faults


def point(where, n, actions=('kill', 'term', 'int', 'enospc')):
  """Fire any fault among `actions` configured for (`where`, `n`)."""
  spec = os.environ.get(ENV)
  if not spec:
    return
  for action, at, k in sorted(_parse(spec)):
    if at == where and k == n and action in actions:
      if action in SIGNALS:
        os.kill(os.getpid(), SIGNALS[action])
      elif action == 'enospc':
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f'injected at {where} {n}')
