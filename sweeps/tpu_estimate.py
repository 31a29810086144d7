"""What a compiled TPU program says a run will cost: a roofline step time, images/s, run and sweep
hours, and the largest global batch that fits a chip (sweeps/preflight.py), and the pricing of a
sweep's arms from their compiled programs (`sweeps.sweep --estimate-tpu`).

  step_s  = max(flops x passes / bf16 peak, bytes accessed / HBM bandwidth)   (per chip)
  run_s   = Σ phases steps x step_s(phase) + evaluations x eval batches x step_s(eval)
  sweep_h = runs x run_s / 3600, the runs one after another on the topology

Optimistic estimates from a compiled program, not measurements: docs/tpu.md.
"""

import csv
import io
import os
import subprocess
import sys
import tempfile

from input_pipeline import batching


def roofline_s(flops, bytes_accessed, passes, chip):
  """The roofline step time in seconds (module doc)."""
  return max(flops * passes / (chip.bf16_tflop_s * 1e12), bytes_accessed / (chip.hbm_gb_s * 1e9))


def evaluations(ctx):
  """How many evaluations a run of `ctx` makes (trainer/cadence.py `due`, the loop's one rule)."""
  from trainer import cadence  # JAX: only once a run is priced, not for --help

  return sum(cadence.due(ctx, step).evaluate for step in range(1, ctx.total_steps + 1))


def run_seconds(ctx, step_s):
  """Seconds of one run (module doc) from {phase name: step_s, 'eval': step_s}; None if a program
  did not compile."""
  if any(step_s.get(p.name) is None for p in ctx.phases) or step_s.get('eval') is None:
    return None
  batches = batching.num_eval_batches(len(ctx.dataset.test), ctx.config.eval_batch_size)
  train = sum((p.stop - p.start) * step_s[p.name] for p in ctx.phases)
  return train + evaluations(ctx) * batches * step_s['eval']


def largest_batch(fits, start, unit, limit, max_compiles=8):
  """(largest multiple of `unit` <= `limit` for which `fits(batch)` holds, as far as the search
  went, compiles used): doubling from `start` (halving where it does not fit) to bracket the
  boundary, then bisection on multiples of `unit`; at most `max_compiles` calls of `fits`. 0 when
  not even `unit` fits."""
  calls = [0]

  def check(batch):
    calls[0] += 1
    return fits(batch)

  limit = max(unit, limit // unit * unit)
  start = max(unit, min(limit, start) // unit * unit)
  if check(start):
    good, bad = start, None
    while bad is None and good < limit and calls[0] < max_compiles:
      candidate = min(limit, good * 2)
      good, bad = (candidate, None) if check(candidate) else (good, candidate)
  else:
    good, bad = 0, start
    while good == 0 and bad > unit and calls[0] < max_compiles:
      candidate = max(unit, bad // 2 // unit * unit)
      good, bad = (candidate, bad) if check(candidate) else (0, candidate)
  while bad is not None and bad - good > unit and calls[0] < max_compiles:
    middle = (good + bad) // 2 // unit * unit
    good, bad = (middle, bad) if check(middle) else (good, middle)
  return good, calls[0]


# --- sweeps.sweep --estimate-tpu: each arm's runs priced from its compiled program ------------


def arm_run_hours(flags, topology, repo, env=None):
  """(run hours, chips) of one arm: `python -m sweeps.preflight` with the arm's config flags for
  `topology`, read from its preflight.csv; ValueError with its last line if it fails."""
  with tempfile.TemporaryDirectory() as out:
    argv = [sys.executable, '-m', 'sweeps.preflight', *flags, '--topology', topology, '--out', out]
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False)
    path = os.path.join(out, 'preflight.csv')
    if proc.returncode or not os.path.exists(path):
      lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
      raise ValueError(lines[-1] if lines else f'exit code {proc.returncode}')
    with open(path) as f:
      rows = list(csv.DictReader(f))
  hours = rows[0].get('run_hours', '')
  if not hours:
    reasons = sorted({r['reason'] for r in rows if r['reason']})
    raise ValueError(f'{topology}: not every program compiled ({"; ".join(reasons)})')
  return float(hours), int(rows[0]['chips'])


def price_arms(runs, flags_of, topology, repo, slots, out=None):
  """Print each distinct arm's run hours on `topology` from its compiled TPU program and the
  sweep's chip-hours and wall-clock at `slots` runs at a time; returns an exit code."""
  out = out or sys.stdout
  arms, counts = {}, {}
  for r in runs:
    arms.setdefault(r.slug, r)
    counts[r.slug] = counts.get(r.slug, 0) + 1
  print(
    f'estimate: compiling each of {len(arms)} arm(s) for {topology} (sweeps.preflight); '
    'TPU compiles take minutes on a small CPU',
    file=out,
    flush=True,
  )
  lines, total, chips = [], 0.0, 1
  for slug, first in arms.items():
    try:
      hours, chips = arm_run_hours(flags_of(first), topology, repo)
    except ValueError as e:
      print(f'error: --estimate-tpu: arm {slug}: {e}', file=sys.stderr)
      return 2
    total += counts[slug] * hours
    lines.append(f'{slug}: {counts[slug]} runs x {hours:.3g} h')
    print(f'estimate: {lines[-1]}', file=out, flush=True)
  print(
    f'total: {total:.4g} run-hours on {topology} ({total * chips:.4g} chip-hours); about '
    f'{total / max(slots, 1):.3g} h of wall-clock at {slots} run(s) at a time. Roofline '
    'estimates from compiled programs, not executions (optimistic: sweeps/tpu_estimate.py)',
    file=out,
    flush=True,
  )
  return 0


def csv_text(rows, columns):
  """`rows` (dicts) as CSV text with `columns`, in order."""
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, columns, extrasaction='ignore', lineterminator='\n')
  writer.writeheader()
  writer.writerows(rows)
  return buffer.getvalue()
