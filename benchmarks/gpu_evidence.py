"""The GPU agenda as one program: every GPU measurement this project waits for, in parts of less
than 9 minutes on an H100, written into one folder to bring back.

  python -m benchmarks.gpu_evidence --list                        # each part, minutes on an H100
  python -m benchmarks.gpu_evidence --budget 15 --out runs/gpu_evidence   # a 15-minute slot's plan
  python -m benchmarks.gpu_evidence --part gpu_tier --out runs/gpu_evidence
  python -m benchmarks.gpu_evidence --part all --out runs/gpu_evidence   # the parts not done yet
  python -m benchmarks.gpu_evidence --pack $OUT/gpu_evidence.tar.gz --out runs/gpu_evidence
  python -m benchmarks.gpu_evidence --smoke --out /tmp/evidence   # every part, toy size, CPU

The parts and their commands: benchmarks/gpu_evidence_parts.py (each an existing tool's command
line). A part runs its commands in order from the repository root, each command's stdout in
OUT/<part>/<label>.txt and stderr in <label>.err, and ends by writing OUT/<part>/status.json
(status, headline, each command with its exit code, seconds and criterion). It fails closed: a part
is `completed` only when every command exited as expected and met its own success criterion (the
benchmark's result line, pytest's summary with a test run, every run of a sweep completed, the
export's table); otherwise it is `failed: <command>: <why>`, naming a missing module (`No module
named pytest`) when the command's stderr says so. Resumable: a part whose status says `completed`
(in the same mode, smoke or not) is skipped unless --force; any other part runs again from its
first command (the study's sweeps skip their completed runs). `--part` runs parts in the order
given (`all`: by what their figures are worth, gpu_evidence_parts.PRIORITY), and with
`--call-minutes M` starts a part only if its expected minutes end within M of the command's start.
`--budget MIN` prints the plan of a slot of MIN minutes of device time (benchmarks/gpu_plan.py):
the calls to make, each's command, and what is left for the next slot; it runs nothing. After
every part the summary is written again: OUT/summary.md and OUT/summary.csv, one row per part
(status, minutes, headline). `--pack FILE` writes OUT as a .tar.gz without the runs' training
states (their records and logs stay), small enough to bring back.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import csv
import json
import os
import sys
import tarfile
import time

from benchmarks import common, gpu_plan
from benchmarks import gpu_evidence_parts as agenda
from benchmarks import gpu_evidence_steps as steps
from runrecord import record

STATUS_FILE = 'status.json'
SUMMARY_COLUMNS = ('part', 'h100_minutes', 'status', 'minutes', 'headline')
PART_MINUTES = 9.0  # the lent machine's commands end at 10 minutes
# Smoke mode: CPU, every compile in one cache, compiled without most optimisations.
SMOKE_ENV = {
  'JAX_PLATFORMS': 'cpu',
  'JAX_DISABLE_MOST_OPTIMIZATIONS': '1',
  'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
}


def parts_named(names):
  """The parts to run: 'all' (by PRIORITY) or comma-separated names, in the order given; one line
  on a bad or repeated name."""
  known = {p.name: p for p in agenda.PARTS}
  wanted = [n.strip() for n in names.split(',') if n.strip()]
  if wanted == ['all']:
    return gpu_plan.by_priority(agenda.PARTS, agenda.PRIORITY)
  unknown = [n for n in wanted if n not in known]
  if unknown or not wanted or len(set(wanted)) != len(wanted):
    common.fail(
      f'--part={names}: give all or part names among {", ".join(known)} (--list), each once'
    )
  return [known[n] for n in wanted]


def read_status(out, name):
  path = os.path.join(out, name, STATUS_FILE)
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def write_json(path, value):
  """Written whole or not at all (a temporary file renamed over it)."""
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=1)
  os.replace(path + '.tmp', path)


def is_done(status, smoke):
  return bool(status) and status['status'] == 'completed' and status['smoke'] == smoke


def run_part(part, out, smoke, part_minutes):
  """Run the part's commands; returns its status dict (also written to OUT/<part>/status.json):
  'completed' only when every command met its criterion (gpu_evidence_steps.step_failure)."""
  ctx = agenda.Context(smoke, out, os.path.join(out, part.name))
  os.makedirs(ctx.folder, exist_ok=True)
  status = {
    'part': part.name,
    'smoke': smoke,
    'status': 'running',
    'commands': [],
    'started': common.host(),
    'minutes': 0.0,
    'headline': '',
  }
  write_json(os.path.join(ctx.folder, STATUS_FILE), status)
  start = time.time()
  for step in part.steps(ctx):
    seconds_left = part_minutes * 60 - (time.time() - start)
    began = time.time()
    if step.call:
      code = steps.run_call(step, ctx)
    elif steps.in_process(step, ctx):
      code = steps.run_module(step, ctx)
    else:
      code = steps.run_command(step, ctx, seconds_left)
    failure = steps.step_failure(step, ctx, code)
    status['commands'].append(
      {
        'label': step.label,
        'exit_code': code,
        'seconds': round(time.time() - began, 1),
        'command': ' '.join(step.argv) if step.argv else 'in process',
        'criterion': failure or 'met',
      }
    )
    if failure:
      status['status'] = 'timed out' if code is None else f'failed: {step.label}: {failure}'
      break
  else:
    status['status'] = 'completed'
  status['minutes'] = round((time.time() - start) / 60, 2)
  try:
    status['headline'] = part.headline(ctx)
  except Exception as e:  # a part's outputs may be partial
    status['headline'] = f'no headline ({type(e).__name__}: {str(e).splitlines()[0][:200]})'
  write_json(os.path.join(ctx.folder, STATUS_FILE), status)
  return status


def summary_rows(out):
  rows = []
  for part in agenda.PARTS:
    s = read_status(out, part.name) or {'status': 'not run', 'minutes': '', 'headline': ''}
    mode = ' (smoke)' if s.get('smoke') else ''
    rows.append(
      {
        'part': part.name,
        'h100_minutes': part.minutes,
        'status': s['status'] + mode,
        'minutes': s['minutes'],
        'headline': s['headline'],
      }
    )
  return rows


def write_summary(out):
  """OUT/summary.csv and OUT/summary.md: every part of the agenda, run or not."""
  rows = summary_rows(out)
  with open(os.path.join(out, 'summary.csv'), 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, SUMMARY_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  lines = [
    f'# GPU evidence ({common.host()})',
    '',
    '| part | expected minutes (H100) | status | minutes | headline |',
    '|---|---|---|---|---|',
  ]
  lines += [
    f'| {r["part"]} | {r["h100_minutes"]} | {r["status"]} | {r["minutes"]} | '
    f'{str(r["headline"]).replace("|", "/")} |'
    for r in rows
  ]
  with open(os.path.join(out, 'summary.md'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return rows


def pack(out, path):
  """OUT as a .tar.gz without the runs' training states (checkpoints/<step>/state) or the
  compilation cache."""

  def keep(info):
    parts = info.name.split('/')
    state = len(parts) >= 3 and parts[-3] == record.CHECKPOINTS and parts[-1] == record.STATE_ITEM
    return None if state or '.jax_cache' in parts else info

  with tarfile.open(path, 'w:gz') as tar:
    tar.add(out, arcname=os.path.basename(os.path.abspath(out)), filter=keep)
  return os.path.getsize(path)


def list_parts():
  total = sum(p.minutes for p in agenda.PARTS)
  for p in agenda.PARTS:
    print(f'{p.name:30s} {p.minutes:4.1f} min  {p.what}')
  print(f'{len(agenda.PARTS)} parts, {total:g} minutes on an H100 in all')


def completed(out, smoke):
  """Names of the parts completed in `out` (in this mode); none without a folder."""
  if not out or not os.path.isdir(out):
    return set()
  return {p.name for p in agenda.PARTS if is_done(read_status(out, p.name), smoke)}


def print_plan(args):
  """--budget: the slot's plan (benchmarks/gpu_plan.py) for the parts not completed in --out."""
  out = args.out or 'runs/gpu_evidence'
  plan = gpu_plan.make_plan(
    agenda.PARTS,
    agenda.PRIORITY,
    args.budget,
    completed(args.out, args.smoke),
    args.startup_minutes,
  )
  print('\n'.join(gpu_plan.describe(plan, out, args.smoke)))
  return 0


def keep_off_the_gpu():
  """This process reads run records (Orbax, which starts JAX) between the parts: on the CPU, so
  that it never takes GPU memory from the commands (JAX would preallocate 75 % of it). Only this
  process: the commands' environment is left as it is."""
  import jax

  jax.config.update('jax_platforms', 'cpu')


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.gpu_evidence',
    description='The GPU agenda as one program: every GPU measurement this project waits for, '
    'in parts of less than 9 minutes on an H100, written into one folder to bring back.',
  )
  p.add_argument('--list', action='store_true', help='print each part and its minutes on an H100')
  p.add_argument(
    '--budget',
    type=float,
    default=None,
    metavar='MIN',
    help='print the plan of a slot of MIN minutes of device time (start-up counted; '
    'the parts not completed in --out): its calls, their commands, what is left for '
    'the next slot; runs nothing',
  )
  p.add_argument(
    '--startup-minutes',
    type=float,
    default=gpu_plan.STARTUP_MINUTES,
    help="a fresh machine's start-up, counted once in --budget (default %(default)s)",
  )
  p.add_argument(
    '--part',
    default=None,
    help="'all' (by what their figures are worth) or comma-separated part names, run in that order",
  )
  p.add_argument('--out', default=None, help='the evidence folder (one per machine)')
  p.add_argument(
    '--smoke', action='store_true', help='toy sizes on CPU (every part, unless --part names some)'
  )
  p.add_argument('--force', action='store_true', help='run parts already completed again')
  p.add_argument(
    '--part-minutes',
    type=float,
    default=PART_MINUTES,
    help='a part still running after this is stopped (status: timed out)',
  )
  p.add_argument(
    '--call-minutes',
    type=float,
    default=None,
    help='start a part only if its expected minutes on an H100 end within this many '
    "minutes of the command's start (the rest: the next call); not in --smoke",
  )
  p.add_argument(
    '--pack',
    default=None,
    metavar='FILE.tar.gz',
    help='write the evidence folder, without training states, to this archive',
  )
  args = p.parse_args(argv)
  for name in ('budget', 'startup_minutes', 'part_minutes', 'call_minutes'):
    value = getattr(args, name)
    if value is not None and not 0 <= value < float('inf'):
      common.fail(f'--{name.replace("_", "-")}={value}: give a number of minutes, 0 or more')
  return args


def fits(part, start, call_minutes, smoke):
  """Whether `part` may start now under --call-minutes (always in smoke mode or without it)."""
  if smoke or call_minutes is None:
    return True
  return (time.time() - start) / 60 + part.minutes <= call_minutes


def main(argv=None):
  args = parse_args(argv)
  if args.list:
    list_parts()
    return 0
  if args.budget is not None:
    return print_plan(args)
  if not args.out:
    common.fail('--out: give the evidence folder, e.g. --out runs/gpu_evidence')
  if args.pack:
    if not os.path.isdir(args.out):
      common.fail(f'--out={args.out}: no evidence folder there to pack')
    print(f'wrote {args.pack}: {pack(args.out, args.pack) / 2**20:.1f} MiB')
    return 0
  if not args.part and not args.smoke:
    common.fail('--part: give all or part names (--list), or --smoke')
  parts = parts_named(args.part or 'all')
  if args.smoke:  # before anything here starts JAX
    os.environ.update(SMOKE_ENV)
    os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(steps.REPO, '.jax_cache'))
  else:
    keep_off_the_gpu()
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  failed, start, left = 0, time.time(), []
  for part in parts:
    if is_done(read_status(out, part.name), args.smoke) and not args.force:
      print(f'{part.name}: completed already (skipped; --force runs it again)')
      continue
    if left or not fits(part, start, args.call_minutes, args.smoke):
      left.append(part.name)
      continue
    print(f'{part.name}: running (expected {part.minutes:g} min on an H100)', flush=True)
    status = run_part(part, out, args.smoke, args.part_minutes)
    failed += status['status'] != 'completed'
    print(
      f'{part.name}: {status["status"]} in {status["minutes"]} min: {status["headline"]}',
      flush=True,
    )
    write_summary(out)
  write_summary(out)
  if left:
    print(
      f'not started (past --call-minutes {args.call_minutes:g}): {",".join(left)}: run the '
      'same command again in the next call'
    )
  print(f'summary: {os.path.join(out, "summary.md")}')
  return 1 if failed or left else 0


if __name__ == '__main__':
  sys.exit(main())
