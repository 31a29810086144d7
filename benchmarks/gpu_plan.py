"""A slot of GPU time planned: which parts of the GPU agenda (benchmarks/gpu_evidence_parts.py) to
run, in which device calls, and what is left for the next slot.

  python -m benchmarks.gpu_evidence --budget 15 [--out runs/gpu_evidence]

A slot is `budget` minutes of device time in all: a fresh machine's start-up (STARTUP_MINUTES,
counted once), then calls of at most CALL_MINUTES each (a lent machine ends a command at 10
minutes), each paying CALL_OVERHEAD_MINUTES (the working tree's transfer, the carried wheels'
install, Python and JAX starting) before its parts. The parts go in PRIORITY order (what each
figure is worth, most first); each joins the current call if it fits there and in the budget,
else opens the next call if that fits, else waits for the next slot. A part that fits no call
at all (longer than a call) is listed as such. Parts already completed in the evidence folder are
left out. Minutes are each part's expected minutes on an H100.
Reference: docs/performance.md "The benchmark scripts".
"""

import collections

STARTUP_MINUTES = 3.0  # a fresh GPU machine: "a minute or more" to start, plus the first transfer
CALL_MINUTES = 9.0  # a device command ends at 10 minutes: a call's overhead and parts stay under 9
CALL_OVERHEAD_MINUTES = 0.5  # each call: transfer, wheels, Python and JAX start

Call = collections.namedtuple('Call', 'parts minutes')  # minutes: overhead + the parts'
Plan = collections.namedtuple('Plan', 'calls later too_long total budget startup overhead limit')


def by_priority(parts, priority):
  """`parts` in the order of `priority` (names); parts it does not name come last, in order."""
  rank = {name: i for i, name in enumerate(priority)}
  return sorted(parts, key=lambda p: rank.get(p.name, len(rank)))


def make_plan(
  parts,
  priority,
  budget,
  done=(),
  startup=STARTUP_MINUTES,
  limit=CALL_MINUTES,
  overhead=CALL_OVERHEAD_MINUTES,
):
  """The Plan of a `budget`-minute slot for the `parts` not in `done` (module doc)."""
  calls, later, too_long, total = [], [], [], startup
  for part in by_priority([p for p in parts if p.name not in done], priority):
    if overhead + part.minutes > limit:
      too_long.append(part)
    elif calls and calls[-1].minutes + part.minutes <= limit and total + part.minutes <= budget:
      calls[-1] = Call(calls[-1].parts + [part], calls[-1].minutes + part.minutes)
      total += part.minutes
    elif total + overhead + part.minutes <= budget:
      calls.append(Call([part], overhead + part.minutes))
      total += overhead + part.minutes
    else:
      later.append(part)
  return Plan(calls, later, too_long, total, budget, startup, overhead, limit)


def names(parts):
  return ','.join(p.name for p in parts)


def minutes(value):
  return f'{value:g}'


def describe(plan, out, smoke=False):
  """The plan as the lines `--budget` prints: each call with its command, the total, the rest."""
  flags = f'--out {out}' + (' --smoke' if smoke else '')
  lines = [
    f'GPU plan for a {minutes(plan.budget)}-minute slot (expected minutes on an H100): '
    f'start-up {minutes(plan.startup)} min, then calls of at most {minutes(plan.limit)} min '
    f'each, {minutes(plan.overhead)} min of each for its transfer and start'
  ]
  for i, call in enumerate(plan.calls, 1):
    parts = ', '.join(f'{p.name} ({minutes(p.minutes)})' for p in call.parts)
    lines.append(f'call {i} ({minutes(call.minutes)} min): {parts}')
    lines.append(
      f'  python -m benchmarks.gpu_evidence --part {names(call.parts)} {flags} '
      f'--call-minutes {minutes(plan.limit - plan.overhead)}'
    )
  if not plan.calls:
    lines.append(
      'no part fits this slot'
      if plan.later or plan.too_long
      else 'nothing to run: every part is completed'
    )
  lines.append(
    f'planned: {minutes(plan.total)} of {minutes(plan.budget)} min '
    f'({len(plan.calls)} call(s), {sum(len(c.parts) for c in plan.calls)} part(s))'
  )
  if plan.later:
    rest = sum(p.minutes for p in plan.later)
    lines.append(
      f'next slot ({len(plan.later)} part(s), {minutes(rest)} min): '
      + ', '.join(f'{p.name} ({minutes(p.minutes)})' for p in plan.later)
    )
  if plan.too_long:
    lines.append('longer than a call (split them): ' + names(plan.too_long))
  return lines
