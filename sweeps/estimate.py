"""A sweep's cost before it runs: what each run will spend, measured here, times the runs.

  python -m sweeps.sweep --config=configs/digits.py:study --root=runs/study --estimate

For each distinct arm (seeds share one compiled program) the sweep starts `python -m
sweeps.estimate` with the arm's first run's config flags and the environment its runs get (same
devices, same compilation cache), `--parallel` arms at a time as its runs would be. That process
does what train.py does, in order, and times each part:
  start-up      process start to the first step: imports, config, data, model, initial state
  compilation   each phase's training step and the evaluation step: the first call (a cold
                compile, or a load where the cache has it already), and the same again after
                jax.clear_caches(), which a later seed of the arm pays (a compilation-cache load)
  steps         `--steps` steps per phase after the compile (host input feeding included)
  evaluation    one full evaluation after the compiling one
  checkpoints   one checkpoint of the state (digest and write, waited for; runs write
                asynchronously while training, so this part is an upper bound)
and prints one line `estimate: {json}`. Then

  run           = start-up + Σ phases (compile + steps × s/step) + evaluations × s/evaluation
                  + checkpoints × s/checkpoint
  device-hours  = Σ arms devices × (first run + (runs - 1) × later run) / 3600

where the arm's first run compiles (cold) and its later runs load the compiles from the cache.
The cold compiles measured here go into that cache, so the sweep's first runs load them instead:
the total then overstates by the cold part, printed. Not included: data preparation (CelebA's
first decode) and the time between runs. Run it on the kind of machine the runs will use.
"""

import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

PREFIX = 'estimate: '
PARTS = ('start-up', 'compilation', 'steps', 'evaluation', 'checkpoints')


def _timed(fn):
  """(seconds, result) of fn(), waiting for the devices."""
  import jax  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def _phase(ctx, state, phase, timed_steps):
  """(state, {name, steps, step_s, compile_s, cached_compile_s}) of one training phase."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import run  # pylint: disable=import-outside-toplevel
  state, step_fn = run.enter_phase(ctx, state, phase, phase.start)
  count = min(timed_steps + 1, phase.stop - phase.start)
  batches = run.batches(ctx, phase.start, phase.start + count)
  first_batch = next(batches)
  first, state = _timed(lambda: step_fn(state, first_batch))  # compiles
  start, timed = time.perf_counter(), 0
  for batch in batches:
    state, timed = step_fn(state, batch), timed + 1
  state = jax.block_until_ready(state)
  step_s = (time.perf_counter() - start) / timed if timed else first
  jax.clear_caches()  # what a later run of the arm pays: tracing and a compilation-cache load
  again, state = _timed(lambda: step_fn(state, first_batch))
  return state, {'name': phase.name, 'steps': phase.stop - phase.start, 'step_s': step_s,
                 'compile_s': max(first - step_s, 0.0),
                 'cached_compile_s': max(again - step_s, 0.0)}


def _evaluation(ctx, state):
  """{evaluation_s, evaluation_compile_s, evaluation_cached_compile_s}."""
  import jax  # pylint: disable=import-outside-toplevel
  from input_pipeline import batching  # pylint: disable=import-outside-toplevel
  from trainer import run, steps  # pylint: disable=import-outside-toplevel
  eval_fn = run.eval_step(ctx, state)
  first, _ = _timed(lambda: run.evaluate(ctx, eval_fn, state))
  full, _ = _timed(lambda: run.evaluate(ctx, eval_fn, state))
  size = ctx.config.eval_batch_size
  batch = batching.to_global(next(batching.eval_batches(
      ctx.dataset.test, size, jax.process_index(), jax.process_count())), ctx.sharded)
  totals = steps.zero_sums(ctx.mesh)
  per_batch = full / batching.num_eval_batches(len(ctx.dataset.test), size)
  jax.clear_caches()
  again, _ = _timed(lambda: eval_fn(state, batch, totals))
  return {'evaluation_s': full, 'evaluation_compile_s': max(first - full, 0.0),
          'evaluation_cached_compile_s': max(again - per_batch, 0.0)}


def _checkpoint_s(state):
  """Seconds to digest and write one checkpoint of `state`, waited for (in a temporary folder)."""
  from trainer import checkpointing, loop  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as folder:
    mngr = checkpointing.manager(folder, 1)
    start = time.perf_counter()
    loop.save_state(mngr, 1, state, {})
    checkpointing.wait(mngr)
    seconds = time.perf_counter() - start
    checkpointing.close(mngr)
  return seconds


def measure(config, timed_steps, launched):
  """What one run of `config` spends on this machine, by part (module doc); `launched`: the
  time.time() at which the parent started this process."""
  from trainer import run  # pylint: disable=import-outside-toplevel
  ctx = run.build(config)
  model, _ = run.init_model(ctx)
  state = run.initial_state(ctx, model)
  startup_s = time.time() - launched
  phases = []
  for phase in ctx.phases:
    state, measured = _phase(ctx, state, phase, timed_steps)
    phases.append(measured)
  due = [run.due(ctx, step) for step in range(1, ctx.total_steps + 1)]
  facts = run.facts()
  return {'platform': facts['platform'], 'device_kind': facts['device_kind'],
          'devices': facts['num_devices'], 'startup_s': startup_s, 'phases': phases,
          'evaluations': sum(d.evaluate for d in due), 'checkpoints': sum(d.save for d in due),
          **_evaluation(ctx, state), 'checkpoint_s': _checkpoint_s(state)}


def parts(m, cached):
  """{part: seconds} of one run of the measured arm `m`; `cached`: its compiles load from the
  compilation cache (a later seed) instead of compiling."""
  key = 'cached_compile_s' if cached else 'compile_s'
  return {'start-up': m['startup_s'],
          'compilation': sum(p[key] for p in m['phases']) + m[f'evaluation_{key}'],
          'steps': sum(p['steps'] * p['step_s'] for p in m['phases']),
          'evaluation': m['evaluations'] * m['evaluation_s'],
          'checkpoints': m['checkpoints'] * m['checkpoint_s']}


def arm_parts(n, m):
  """{part: device-seconds} of an arm of `n` runs: the first compiles, the others load."""
  first, later = parts(m, cached=False), parts(m, cached=True)
  return {k: m['devices'] * (first[k] + (n - 1) * later[k]) for k in PARTS}


def device_hours(arms):
  """Σ arms devices × (first run + (runs - 1) × later run) / 3600, from [(slug, runs, m)]."""
  return sum(sum(arm_parts(n, m).values()) for _, n, m in arms) / 3600


def table(arms):
  """The per-arm lines: seconds of a run by part (compiles and the whole run: the first run /
  a later one), and the arm's device-hours."""
  width = max(len('arm'), *(len(slug) for slug, _, _ in arms))
  lines = [f'{"arm":<{width}} {"runs":>4} {"start-up s":>10} {"compile s 1st/later":>19} '
           f'{"steps x s/step":>22} {"evals x s":>11} {"ckpts x s":>11} '
           f'{"s/run 1st/later":>15} {"device-h":>9}']
  for slug, n, m in arms:
    first, later = parts(m, False), parts(m, True)
    per_step = ', '.join(f'{p["steps"]} x {p["step_s"]:.3g}' for p in m['phases'])
    compiles = f'{first["compilation"]:.1f}/{later["compilation"]:.1f}'
    totals = f'{sum(first.values()):.1f}/{sum(later.values()):.1f}'
    lines.append(
        f'{slug:<{width}} {n:>4} {m["startup_s"]:>10.1f} {compiles:>19} {per_step:>22} '
        f'{m["evaluations"]:>3} x {m["evaluation_s"]:<5.3g} '
        f'{m["checkpoints"]:>3} x {m["checkpoint_s"]:<5.3g} {totals:>15} '
        f'{device_hours([(slug, n, m)]):>9.4g}')
  return lines


def summary(arms, slots, cache_dir):
  """The total with its formula, its parts, what is left out, and the wall-clock at `slots`."""
  first_m = arms[0][2]
  runs = sum(n for _, n, _ in arms)
  hours = device_hours(arms)
  per_arm = [arm_parts(n, m) for _, n, m in arms]
  by_part = {k: sum(p[k] for p in per_arm) / 3600 for k in PARTS}
  cold = sum(m['devices'] * (parts(m, False)['compilation'] - parts(m, True)['compilation'])
             for _, _, m in arms) / 3600
  wall = hours * 3600 / first_m['devices'] / slots
  return [
      f'total: {hours:.4g} device-hours for {runs} runs on {first_m["devices"]} x '
      f'{first_m["device_kind"]} ({first_m["platform"]}) per run; about {wall / 60:.1f} min of '
      f'wall-clock at {slots} run(s) at a time',
      '  = Σ arms devices × (first run + (runs - 1) × later run) / 3600, a run = start-up + '
      'Σ phases (compile + steps × s/step) + evaluations × s/evaluation + checkpoints × '
      's/checkpoint; the first run of an arm compiles, the later ones load its compiles from '
      'the cache',
      '  parts: ' + ', '.join(f'{k} {v:.3g}' for k, v in by_part.items()) + ' device-hours',
      f'  the cold compiles measured here ({cold:.3g} device-hours) are now in the compilation '
      f'cache {cache_dir}: the sweep\'s first runs load them instead, if it is kept',
      '  not included: data preparation (CelebA\'s first decode) and the time between runs; '
      'checkpoint writes measured waited for (runs write them while training)']


def measure_arm(flags, env, repo, timed_steps):
  """Run `python -m sweeps.estimate` for one arm; its measurement, or raise ValueError."""
  argv = [sys.executable, '-m', 'sweeps.estimate', *flags, f'--steps={timed_steps}',
          f'--launched={time.time()!r}']
  proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False)
  found = [l[len(PREFIX):] for l in proc.stdout.splitlines() if l.startswith(PREFIX)]
  if proc.returncode or not found:
    lines = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
    raise ValueError(lines[-1] if lines else f'exit code {proc.returncode}')
  return json.loads(found[-1])


def measure_arms(runs, flags_of, envs, repo, timed_steps):
  """Measure each distinct arm (its first run's config flags, loaded by the arm's own process as
  train.py would), len(envs) at a time (one environment per slot, as the sweep's runs get them),
  and print the table; returns an exit code (2 if an arm cannot be measured)."""
  firsts, counts = {}, collections.Counter(r.slug for r in runs)
  for r in runs:
    firsts.setdefault(r.slug, r)
  start, slots = time.time(), len(envs)
  print(f'estimate: measuring {len(firsts)} arm(s), {slots} at a time: start-up, compiles (cold '
        f'and from the cache), {timed_steps} steps per phase, evaluations, one checkpoint',
        flush=True)
  free = list(envs)
  def one(slug):
    env = free.pop()
    try:
      return measure_arm(flags_of(firsts[slug]), env, repo, timed_steps)
    finally:
      free.append(env)
  measured = {}
  with concurrent.futures.ThreadPoolExecutor(slots) as pool:
    futures = {pool.submit(one, slug): slug for slug in firsts}
    for future in concurrent.futures.as_completed(futures):
      slug = futures[future]
      try:
        measured[slug] = future.result()
      except ValueError as e:
        print(f'error: --estimate: arm {slug}: {e}', file=sys.stderr)
        return 2
      print(f'estimate: {slug} measured ({len(measured)}/{len(firsts)}, '
            f'{time.time() - start:.0f} s)', flush=True)
  arms = [(slug, counts[slug], measured[slug]) for slug in firsts]
  cache_dir = envs[0].get('JAX_COMPILATION_CACHE_DIR', '(none)')
  print('\n'.join(table(arms) + summary(arms, slots, cache_dir)), flush=True)
  print(f'estimate: took {time.time() - start:.0f} s', flush=True)
  return 0


def parse_rest(rest):
  """(timed steps, launch time) from the flags after the config's."""
  values = {'--steps': '5', '--launched': None}
  for item in rest:
    name, eq, value = item.partition('=')
    if name not in values or not eq:
      raise ValueError(f'unexpected arguments {rest}: give --config=SPEC, '
                       '--config.<field>=<value>, --steps=N and --launched=TIME')
    values[name] = value
  return int(values['--steps']), float(values['--launched'] or time.time())


def main(argv=None):
  """`python -m sweeps.estimate --config=SPEC [--config.<f>=<v> ...] [--steps=N]
  [--launched=TIME]`."""
  argv = sys.argv[1:] if argv is None else argv
  if any(a in ('-h', '--help') for a in argv):
    print(main.__doc__.strip() + '\n\nOne arm of `python -m sweeps.sweep --estimate` (this '
          "module's doc says what it measures); prints one line `estimate: {json}`.")
    return 0
  from configs import loader  # pylint: disable=import-outside-toplevel
  spec, overrides, rest = loader.split_argv(argv)
  try:
    steps, launched = parse_rest(rest)  # a bad flag: one line, before JAX loads
    loaded = loader.load(spec, overrides)
    from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel
    from trainer import validation  # pylint: disable=import-outside-toplevel
    config = validation.resolve(loaded)
    numerics_setup.configure(config)  # before any backend starts, as in train.py
    result = measure(config, steps, launched)
  except ValueError as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    return 2
  print(PREFIX + json.dumps(result), flush=True)
  return 0


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.exit(main())
