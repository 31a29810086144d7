"""A sweep's cost before it runs (`sweeps.sweep --estimate`): its runs measured in child processes,
or (`--estimate-tpu`) priced from their compiled TPU programs; docs/operations.md ("Sweeps ...")."""

import collections
import concurrent.futures
import csv
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from analysis import analyse as cli
from sweeps import runner

PREFIX = 'estimate-result: '  # a measuring process's result line (progress lines: PROGRESS)
PROGRESS = 'estimate: '
PARTS = ('start-up', 'compilation', 'steps', 'evaluation', 'checkpoints')


# --- the sweep's side: the arms measured in processes, the table and the total ---
def parts(m, cached):
  """{part: seconds} of one run of the measured arm `m` (`cached`: a later seed's)."""
  key = 'cached_compile_s' if cached else 'compile_s'
  return {
    'start-up': m['startup_s'],
    'compilation': sum(p[key] for p in m['phases']) + m[f'evaluation_{key}'],
    'steps': sum(p['steps'] * p['step_s'] for p in m['phases']),
    'evaluation': m['evaluations'] * m['evaluation_s'],
    'checkpoints': m['checkpoints'] * m['checkpoint_s'],
  }


def arm_parts(n, m):
  """{part: device-seconds} of an arm of `n` runs: the first compiles, the others load."""
  first, later = parts(m, cached=False), parts(m, cached=True)
  return {k: m['devices'] * (first[k] + (n - 1) * later[k]) for k in PARTS}


def device_hours(arms):
  """Σ arms devices × (first run + (runs - 1) × later run) / 3600, from [(slug, runs, m)]."""
  return sum(sum(arm_parts(n, m).values()) for _, n, m in arms) / 3600


def table(arms):
  """Per arm of [(slug, runs, m)]: a run's seconds by part (the first / a later), device-hours."""
  width = max(len('arm'), *(len(slug) for slug, _, _ in arms))
  lines = [
    f'{"arm":<{width}} {"runs":>4} {"start-up s":>10} {"compile s 1st/later":>19} '
    f'{"steps x s/step":>22} {"evals x s":>11} {"ckpts x s":>11} '
    f'{"s/run 1st/later":>15} {"device-h":>9}'
  ]
  for slug, n, m in arms:
    first, later = parts(m, False), parts(m, True)
    per_step = ', '.join(f'{p["steps"]} x {p["step_s"]:.3g}' for p in m['phases'])
    compiles = f'{first["compilation"]:.1f}/{later["compilation"]:.1f}'
    totals = f'{sum(first.values()):.1f}/{sum(later.values()):.1f}'
    lines.append(
      f'{slug:<{width}} {n:>4} {m["startup_s"]:>10.1f} {compiles:>19} {per_step:>22} '
      f'{m["evaluations"]:>3} x {m["evaluation_s"]:<5.3g} '
      f'{m["checkpoints"]:>3} x {m["checkpoint_s"]:<5.3g} {totals:>15} '
      f'{device_hours([(slug, n, m)]):>9.4g}'
    )
  return lines


def summary(arms, slots, cache_dir):
  """The total with its formula, its parts, what is left out, and the wall-clock at `slots`."""
  first_m, hours = arms[0][2], device_hours(arms)
  per_arm = [arm_parts(n, m) for _, n, m in arms]
  by_part = {k: sum(p[k] for p in per_arm) / 3600 for k in PARTS}
  compiled = [(m, parts(m, False), parts(m, True)) for _, _, m in arms]
  cold = sum(m['devices'] * (f['compilation'] - c['compilation']) for m, f, c in compiled) / 3600
  wall = hours * 3600 / first_m['devices'] / slots
  return [
    f'total: {hours:.4g} device-hours for {sum(n for _, n, _ in arms)} runs on '
    f'{first_m["devices"]} x {first_m["device_kind"]} ({first_m["platform"]}) per run; about '
    f'{wall / 60:.1f} min of wall-clock at {slots} run(s) at a time',
    '  = Σ arms devices × (first run + (runs - 1) × later run) / 3600, a run = start-up + '
    'Σ phases (compile + steps × s/step) + evaluations × s/evaluation + checkpoints × '
    "s/checkpoint; later runs load the first one's compiles from the cache",
    '  parts: ' + ', '.join(f'{k} {v:.3g}' for k, v in by_part.items()) + ' device-hours',
    f'  the cold compiles measured here ({cold:.3g} device-hours) stay in the cache {cache_dir}',
    "  not included: data preparation (CelebA's first decode) and the time between runs",
  ]


def measure_group(arms, env, timed_steps, say=print):
  """{slug: measurement} of `arms` [(slug, config flags)] from one measuring process in `env`."""
  listed = json.dumps([{'slug': slug, 'flags': list(flags)} for slug, flags in arms])
  argv = [sys.executable, '-m', 'sweeps.estimate', f'--arms={listed}', f'--steps={timed_steps}']
  argv.append(f'--launched={time.time()!r}')
  found, lines = {}, []
  one_stream = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # no deadlock
  with subprocess.Popen(argv, cwd=runner.REPO, env=env, **one_stream) as proc:
    for line in proc.stdout:
      lines.append(line.rstrip('\n'))
      if line.startswith(PREFIX):
        result = json.loads(line[len(PREFIX) :])
        found[result.pop('slug')] = result
      elif line.startswith(PROGRESS):
        say(lines[-1])
  code = proc.returncode
  if code or len(found) != len(arms):
    last = [line for line in lines if line.strip()]
    raise ValueError(last[-1] if last else f'exit code {code}')
  return found


def arms_of(runs):  # ({slug: the arm's first run}, {slug: its runs}), in the runs' order
  firsts = {}
  for r in runs:
    firsts.setdefault(r.slug, r)
  return firsts, collections.Counter(r.slug for r in runs)


def measure_arms(runs, flags_of, envs, timed_steps):
  """Measure each arm (its first run's config flags) in len(envs) processes at a time, one slot's
  environment each, and print the table; an exit code (2: an arm cannot be measured)."""
  from numerics import setup as numerics_setup

  firsts, counts = arms_of(runs)
  start, slots, by_flags, chunks = time.time(), len(envs), collections.defaultdict(list), []
  for slug, run in firsts.items():  # processes: round-robin, `slots` at most per set of XLA flags
    by_flags[tuple(numerics_setup.xla_flags(run.config)) if run.config else ()].append(slug)
  for slugs in by_flags.values():
    n = min(slots, len(slugs))
    chunks += [slugs[i::n] for i in range(n)]
  print(
    f'estimate: measuring {len(firsts)} arm(s), {slots} at a time, in {len(chunks)} process(es): a '
    'start-up and a data load per process; per distinct training program one cold compile, one '
    f'cache load and {timed_steps} steps; per arm one evaluation and one checkpoint',
    flush=True,
  )
  free, lock = list(envs), threading.Lock()

  def say(line):
    with lock:
      print(f'{line} ({time.time() - start:.0f} s)', flush=True)

  def one(chunk):
    env = free.pop()
    try:
      return measure_group([(s, flags_of(firsts[s])) for s in chunk], env, timed_steps, say)
    finally:
      free.append(env)

  measured = {}
  with concurrent.futures.ThreadPoolExecutor(slots) as pool:
    futures = {pool.submit(one, chunk): chunk for chunk in chunks}
    for future in concurrent.futures.as_completed(futures):
      try:
        measured.update(future.result())
      except ValueError as e:
        print(f'error: --estimate: arm(s) {", ".join(futures[future])}: {e}', file=sys.stderr)
        return 2
      say(f'estimate: {", ".join(futures[future])} measured ({len(measured)}/{len(firsts)})')
  arms = [(slug, counts[slug], measured[slug]) for slug in firsts]
  cache_dir = envs[0].get('JAX_COMPILATION_CACHE_DIR', '(none)')
  print('\n'.join(table(arms) + summary(arms, slots, cache_dir)), flush=True)
  print(f'estimate: took {time.time() - start:.0f} s', flush=True)
  return 0


# --- `--estimate-tpu`: each arm's runs priced from its compiled TPU programs ---
def arm_run_hours(flags, topology):
  """({tpu.TERMS name: seconds} of a run of the arm, chips) from sweeps.preflight; or ValueError."""
  from sweeps import tpu

  with tempfile.TemporaryDirectory() as out:
    argv = [sys.executable, '-m', 'sweeps.preflight', *flags, '--topology', topology, '--out', out]
    proc = subprocess.run(argv, cwd=runner.REPO, capture_output=True, text=True, check=False)
    path = os.path.join(out, 'preflight.csv')
    if proc.returncode or not os.path.exists(path):
      lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
      raise ValueError(lines[-1] if lines else f'exit code {proc.returncode}')
    with open(path, encoding='utf-8') as f:
      rows = list(csv.DictReader(f))
  if not rows[0].get('run_hours', ''):
    reasons = sorted({r['reason'] for r in rows if r['reason']})
    raise ValueError(f'{topology}: not every program compiled ({"; ".join(reasons)})')
  return {k: float(rows[0][f'{k}_s']) for k in tpu.TERMS}, int(rows[0]['chips'])


def price_arms(runs, flags_of, topology, slots):
  """Prints each arm's run on `topology` by tpu.TERMS, then the sweep's totals; an exit code."""
  from sweeps import tpu

  firsts, counts = arms_of(runs)
  print(
    f'estimate: compiling each of {len(firsts)} arm(s) for {topology} (sweeps.preflight); '
    'TPU compiles take minutes on a small CPU',
    flush=True,
  )
  total, chips, by_term = 0.0, 1, dict.fromkeys(tpu.TERMS, 0.0)
  for slug, first in firsts.items():
    try:
      terms, chips = arm_run_hours(flags_of(first), topology)
    except ValueError as e:
      print(f'error: --estimate-tpu: arm {slug}: {e}', file=sys.stderr)
      return 2
    total += counts[slug] * sum(terms.values()) - (counts[slug] - 1) * terms['compilation']
    by_term = {k: v + counts[slug] * terms[k] for k, v in by_term.items()}
    said = ', '.join(f'{k} {tpu.readable(v)}' for k, v in terms.items())
    print(f'estimate: {slug}: {counts[slug]} runs x {tpu.readable(sum(terms.values()))} ({said})')
  print(
    f'total: {total / 3600:.4g} run-hours on {topology} ({total * chips / 3600:.4g} chip-hours: '
    + ', '.join(f'{k} {v * chips / 3600:.3g}' for k, v in by_term.items())
    + f'); about {tpu.readable(total / slots)} of wall-clock at {slots} run(s) at a time '
    f'({"--tpu-chips" if slots > 1 else "give --tpu-chips to run several side by side"})',
    *(f'  {k}: {v}' for k, v in tpu.TERMS.items()),
    sep='\n',
    flush=True,
  )
  return 0


# --- the measuring process: what train.py does for each arm, timed here ---
def timed(fn):  # (seconds, result) of fn(), waiting for the devices
  import jax

  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def measure_phase(ctx, state, phase, timed_steps, programs, say):
  """(state, {name, steps, step_s, compile_s, cached_compile_s, program}) of one phase; a step
  whose program ({HLO fingerprint: measurement}) was measured already is not run."""
  import jax

  from trainer import run, train

  state, step_fn = train.enter_phase(ctx, state, phase, phase.start)
  count = min(timed_steps + 1, phase.stop - phase.start)
  batches = run.batches(ctx, phase.start, phase.start + count)
  first_batch = next(batches)
  program = hashlib.sha256(step_fn.lower(state, first_batch).as_text().encode()).hexdigest()[:16]
  if program in programs:
    say(f'phase {phase.name}: the program of a step measured already: its measurement shared')
    return state, {**programs[program], 'name': phase.name, 'steps': phase.stop - phase.start}
  say(
    f'phase {phase.name}: compiling its training step (cold), timing {count - 1} steps, '
    'loading it again from the cache'
  )
  first, state = timed(lambda: step_fn(state, first_batch))  # compiles
  start, steps_run = time.perf_counter(), 0
  for batch in batches:
    state, steps_run = step_fn(state, batch), steps_run + 1
  state = jax.block_until_ready(state)
  step_s = (time.perf_counter() - start) / steps_run if steps_run else first
  jax.clear_caches()  # what a later run of the arm pays: tracing and a compilation-cache load
  again, state = timed(lambda: step_fn(state, first_batch))
  programs[program] = {
    'name': phase.name,
    'steps': phase.stop - phase.start,
    'step_s': step_s,
    'compile_s': max(first - step_s, 0.0),
    'cached_compile_s': max(again - step_s, 0.0),
    'program': program,
  }
  return state, programs[program]


def measure(config, timed_steps, launched, programs, say, ctx=None):
  """(what one run of `config` spends here, the run context); `ctx`: one whose data to reuse."""
  import jax

  from input_pipeline import batching
  from trainer import checkpoint, process, run, train

  say('loading the data, initialising the model')
  ctx = run.build(config, ctx.dataset if ctx is not None else None)
  state = train.initial_state(ctx, run.init_model(ctx)[0])
  startup_s = time.time() - launched
  phases = []
  for phase in ctx.phases:
    state, measured = measure_phase(ctx, state, phase, timed_steps, programs, say)
    phases.append(measured)
  due = [run.due(ctx, step) for step in range(1, ctx.total_steps + 1)]
  facts = process.execution_facts()
  say('compiling and running one evaluation, writing one checkpoint')
  eval_fn = train.eval_fn(ctx, state)
  first, _ = timed(lambda: train.evaluate(ctx, eval_fn, state))
  full, _ = timed(lambda: train.evaluate(ctx, eval_fn, state))
  size = run.eval_batch(ctx)
  test = batching.eval_batches(ctx.dataset.test, size, jax.process_index(), jax.process_count())
  batch = batching.to_global(next(test), ctx.sharded)
  totals = run.zero_sums(ctx.mesh)
  per_batch = full / batching.num_eval_batches(len(ctx.dataset.test), size)
  jax.clear_caches()
  again, _ = timed(lambda: eval_fn(state, batch, totals))
  with tempfile.TemporaryDirectory() as folder:  # one checkpoint, waited for
    mngr = checkpoint.manager(folder, 1)
    start = time.perf_counter()
    checkpoint.save(mngr, 1, {}, state)
    checkpoint.wait(mngr)
    saved_s = time.perf_counter() - start
    checkpoint.close(mngr)
  return {
    'platform': facts['platform'],
    'device_kind': facts['device_kind'],
    'devices': facts['num_devices'],
    'startup_s': startup_s,
    'phases': phases,
    'evaluations': sum(d.evaluate for d in due),
    'checkpoints': sum(d.save for d in due),
    'evaluation_s': full,
    'evaluation_compile_s': max(first - full, 0.0),
    'evaluation_cached_compile_s': max(again - per_batch, 0.0),
    'checkpoint_s': saved_s,
  }, ctx


def main(argv=None):
  p = cli.Parser(
    prog='python -m sweeps.estimate',
    description='One measuring process of `python -m sweeps.sweep --estimate`: prints one '
    '`estimate-result: {json}` line per arm.',
  )
  p.add_argument('--arms', required=True, help='JSON list of {"slug", "flags"}: config flags')
  p.add_argument('--steps', type=int, default=5, help='steps timed per phase after the compile')
  p.add_argument('--launched', type=float, default=None, help='time.time() the sweep started it')
  args = p.parse_args(argv)
  from configs import common, validation
  from numerics import setup as numerics_setup

  try:  # bad input, before JAX starts
    arms = [(a['slug'], common.split_argv(a['flags'])[:2]) for a in json.loads(args.arms)]
    configs = [(slug, validation.resolve(common.load(*flags))) for slug, flags in arms]
  except ValueError as e:
    cli.fail(str(e).splitlines()[0])
  for _, config in configs:
    numerics_setup.configure(config)  # before any backend starts, as in train.py
  out, programs, contexts = [], {}, {}
  for slug, config in configs:
    say = functools.partial(print, f'{PROGRESS}{slug}:', flush=True)  # measure_group reads them
    data = json.dumps(config.data.to_dict(), sort_keys=True, default=str)
    begin = (args.launched or time.time()) if not out else time.time()
    measured, contexts[data] = measure(config, args.steps, begin, programs, say, contexts.get(data))
    if out:  # this arm's own set-up, plus the process start it did not pay here
      measured['startup_s'] += out[0][1]['startup_s']
    out.append((slug, measured))
  for slug, result in out:
    print(PREFIX + json.dumps({'slug': slug, **result}), flush=True)
  return 0


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.exit(main())
