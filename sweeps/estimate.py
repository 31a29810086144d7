"""A sweep's cost before it runs: what each run will spend, measured here, times the runs.

  python -m sweeps.sweep --config=configs/digits.py:study --root=runs/study --estimate

The sweep starts `python -m sweeps.estimate` processes with the environment its runs get, each
timing what train.py does for a share of the arms: start-up, compiles (cold, and as a cache load),
`--steps` steps per phase, an evaluation and a checkpoint. Then

  run           = start-up + Σ phases (compile + steps × s/step) + evaluations × s/evaluation
                  + checkpoints × s/checkpoint
  device-hours  = Σ arms devices × (first run + (runs - 1) × later run) / 3600

What each part includes and what is left out: docs/operations.md ("Sweeps and studies").
"""

import collections
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

PREFIX = 'estimate-result: '  # a result line; progress lines start with PROGRESS
PROGRESS = 'estimate: '
PARTS = ('start-up', 'compilation', 'steps', 'evaluation', 'checkpoints')


def _timed(fn):
  """(seconds, result) of fn(), waiting for the devices."""
  import jax  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def _phase(ctx, state, phase, timed_steps, programs=None, say=print):
  """(state, {name, steps, step_s, compile_s, cached_compile_s, program}) of one training phase;
  `programs` ({HLO fingerprint: measurement}) shares the measurement of a step this process has
  measured already that lowers to the same program (nothing is then compiled or run)."""
  import jax  # pylint: disable=import-outside-toplevel

  from trainer import run  # pylint: disable=import-outside-toplevel

  state, step_fn = run.enter_phase(ctx, state, phase, phase.start)
  count = min(timed_steps + 1, phase.stop - phase.start)
  batches = run.batches(ctx, phase.start, phase.start + count)
  first_batch = next(batches)
  program = hashlib.sha256(step_fn.lower(state, first_batch).as_text().encode()).hexdigest()[:16]
  if programs is not None and program in programs:
    say(f'phase {phase.name}: the program of a step measured already: its measurement shared')
    return state, {**programs[program], 'name': phase.name, 'steps': phase.stop - phase.start}
  say(
    f'phase {phase.name}: compiling its training step (cold), timing {count - 1} steps, '
    'loading it again from the cache'
  )
  first, state = _timed(lambda: step_fn(state, first_batch))  # compiles
  start, timed = time.perf_counter(), 0
  for batch in batches:
    state, timed = step_fn(state, batch), timed + 1
  state = jax.block_until_ready(state)
  step_s = (time.perf_counter() - start) / timed if timed else first
  jax.clear_caches()  # what a later run of the arm pays: tracing and a compilation-cache load
  again, state = _timed(lambda: step_fn(state, first_batch))
  measured = {
    'name': phase.name,
    'steps': phase.stop - phase.start,
    'step_s': step_s,
    'compile_s': max(first - step_s, 0.0),
    'cached_compile_s': max(again - step_s, 0.0),
    'program': program,
  }
  if programs is not None:
    programs[program] = measured
  return state, measured


def _evaluation(ctx, state):
  """{evaluation_s, evaluation_compile_s, evaluation_cached_compile_s}."""
  import jax  # pylint: disable=import-outside-toplevel

  from input_pipeline import batching  # pylint: disable=import-outside-toplevel
  from trainer import run, steps  # pylint: disable=import-outside-toplevel

  eval_fn = run.eval_step(ctx, state)
  first, _ = _timed(lambda: run.evaluate(ctx, eval_fn, state))
  full, _ = _timed(lambda: run.evaluate(ctx, eval_fn, state))
  size = ctx.config.eval_batch_size
  batch = batching.to_global(
    next(batching.eval_batches(ctx.dataset.test, size, jax.process_index(), jax.process_count())),
    ctx.sharded,
  )
  totals = steps.zero_sums(ctx.mesh)
  per_batch = full / batching.num_eval_batches(len(ctx.dataset.test), size)
  jax.clear_caches()
  again, _ = _timed(lambda: eval_fn(state, batch, totals))
  return {
    'evaluation_s': full,
    'evaluation_compile_s': max(first - full, 0.0),
    'evaluation_cached_compile_s': max(again - per_batch, 0.0),
  }


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
  return _measure(config, timed_steps, launched)[0]


def _measure(config, timed_steps, launched, programs=None, say=print, ctx=None):
  """(measure's dict, the run context): `programs` and `ctx` (a run context whose dataset to
  reuse) shared with the arms this process measured before (measure_all)."""
  from trainer import cadence, execution, run  # pylint: disable=import-outside-toplevel

  say('loading the data, initialising the model')
  ctx = run.build(config, ctx.dataset if ctx is not None else None)
  model, _ = run.init_model(ctx)
  state = run.initial_state(ctx, model)
  startup_s = time.time() - launched
  phases = []
  for phase in ctx.phases:
    state, measured = _phase(ctx, state, phase, timed_steps, programs, say)
    phases.append(measured)
  due = [cadence.due(ctx, step) for step in range(1, ctx.total_steps + 1)]
  facts = execution.facts()
  say('compiling and running one evaluation, writing one checkpoint')
  return {
    'platform': facts['platform'],
    'device_kind': facts['device_kind'],
    'devices': facts['num_devices'],
    'startup_s': startup_s,
    'phases': phases,
    'evaluations': sum(d.evaluate for d in due),
    'checkpoints': sum(d.save for d in due),
    **_evaluation(ctx, state),
    'checkpoint_s': _checkpoint_s(state),
  }, ctx


def measure_all(arms, timed_steps, launched):
  """[(slug, measurement)] of several arms ([(slug, resolved config)], one set of XLA flags)
  measured in this process: the start-up is the first arm's (a run pays it once, whatever the
  arm), the data is loaded once per data config, each training program is measured once."""
  out, programs, contexts = [], {}, {}
  for slug, config in arms:
    say = lambda what, slug=slug: print(f'{PROGRESS}{slug}: {what}', flush=True)
    data = json.dumps(config.data.to_dict(), sort_keys=True, default=str)
    begin = time.time()
    measured, contexts[data] = _measure(
      config, timed_steps, launched if not out else begin, programs, say, contexts.get(data)
    )
    if out:  # this arm's own set-up, plus the process start it did not pay here
      measured['startup_s'] += out[0][1]['startup_s']
    out.append((slug, measured))
  return out


def parts(m, cached):
  """{part: seconds} of one run of the measured arm `m`; `cached`: its compiles load from the
  compilation cache (a later seed) instead of compiling."""
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
  """The per-arm lines: seconds of a run by part (compiles and the whole run: the first run /
  a later one), and the arm's device-hours."""
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
  first_m = arms[0][2]
  runs = sum(n for _, n, _ in arms)
  hours = device_hours(arms)
  per_arm = [arm_parts(n, m) for _, n, m in arms]
  by_part = {k: sum(p[k] for p in per_arm) / 3600 for k in PARTS}
  cold = (
    sum(
      m['devices'] * (parts(m, False)['compilation'] - parts(m, True)['compilation'])
      for _, _, m in arms
    )
    / 3600
  )
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
    f"cache {cache_dir}: the sweep's first runs load them instead, if it is kept",
    "  not included: data preparation (CelebA's first decode) and the time between runs; "
    'checkpoint writes measured waited for (runs write them while training)',
  ]


def measure_group(arms, env, repo, timed_steps, say=print):
  """Run one `python -m sweeps.estimate --arms=FILE` process for `arms` ([(slug, config flags)],
  one set of XLA flags) in `env`; its progress lines go to say() as they come; returns {slug:
  measurement}, or raises ValueError with the process's last line."""
  with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
    json.dump([{'slug': slug, 'flags': list(flags)} for slug, flags in arms], f)
  argv = [
    sys.executable,
    '-m',
    'sweeps.estimate',
    f'--arms={f.name}',
    f'--steps={timed_steps}',
    f'--launched={time.time()!r}',
  ]
  found, lines = {}, []
  try:
    with tempfile.TemporaryFile('w+') as err:
      proc = subprocess.Popen(
        argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=err, text=True
      )
      for line in proc.stdout:
        line = line.rstrip('\n')
        lines.append(line)
        if line.startswith(PREFIX):
          result = json.loads(line[len(PREFIX) :])
          found[result.pop('slug')] = result
        elif line.startswith(PROGRESS):
          say(line)
      code = proc.wait()
      err.seek(0)
      lines += err.read().splitlines()
  finally:
    os.unlink(f.name)
  if code or len(found) != len(arms):
    last = [l for l in lines if l.strip()]
    raise ValueError(last[-1] if last else f'exit code {code}')
  return found


def xla_key(run):
  """The XLA flags a run's process needs (arms needing others cannot share a process)."""
  if run.config is None:
    return ()
  from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel

  return tuple(numerics_setup.xla_flags(run.config))


def groups(firsts, slots):
  """[[slug, ...], ...]: the arms split into processes, at most `slots` per set of XLA flags,
  round-robin (arms of one set of flags only)."""
  by_flags = collections.defaultdict(list)
  for slug, run in firsts.items():
    by_flags[xla_key(run)].append(slug)
  out = []
  for slugs in by_flags.values():
    n = min(slots, len(slugs))
    out += [slugs[i::n] for i in range(n)]
  return out


def measure_arms(runs, flags_of, envs, repo, timed_steps):
  """Measure each distinct arm (its first run's config flags, loaded as train.py would) in
  len(envs) processes at a time (one environment per slot, as the sweep's runs get them), and
  print the table; returns an exit code (2 if an arm cannot be measured)."""
  firsts, counts = {}, collections.Counter(r.slug for r in runs)
  for r in runs:
    firsts.setdefault(r.slug, r)
  start, slots = time.time(), len(envs)
  chunks = groups(firsts, slots)
  print(
    f'estimate: measuring {len(firsts)} arm(s), {slots} at a time, in {len(chunks)} '
    f'process(es): a start-up and a data load per process; per distinct training program '
    f'one cold compile, one cache load and {timed_steps} steps; per arm one evaluation and '
    'one checkpoint',
    flush=True,
  )
  free, lock = list(envs), threading.Lock()

  def say(line):
    with lock:
      print(f'{line} ({time.time() - start:.0f} s)', flush=True)

  def one(chunk):
    env = free.pop()
    try:
      return measure_group([(s, flags_of(firsts[s])) for s in chunk], env, repo, timed_steps, say)
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


def parse_rest(rest):
  """(timed steps, launch time, arms file or None) from the flags after the config's."""
  values = {'--steps': '5', '--launched': None, '--arms': None}
  for item in rest:
    name, eq, value = item.partition('=')
    if name not in values or not eq:
      raise ValueError(
        f'unexpected arguments {rest}: give --arms=FILE (or --config=SPEC and '
        '--config.<field>=<value>), --steps=N and --launched=TIME'
      )
    values[name] = value
  return (int(values['--steps']), float(values['--launched'] or time.time()), values['--arms'])


def main(argv=None):
  """`python -m sweeps.estimate --arms=FILE [--steps=N] [--launched=TIME]`, FILE a JSON list of
  {"slug", "flags"} (each arm's config flags, `--config=SPEC --config.<f>=<v> ...`); or one arm's
  config flags directly."""
  argv = sys.argv[1:] if argv is None else argv
  if any(a in ('-h', '--help') for a in argv):
    print(
      main.__doc__.strip() + '\n\nThe processes of `python -m sweeps.sweep --estimate` (this '
      "module's doc says what they measure); one `estimate-result: {json}` line per arm."
    )
    return 0
  from configs import loader  # pylint: disable=import-outside-toplevel

  spec, overrides, rest = loader.split_argv(argv)
  try:
    steps, launched, arms_file = parse_rest(rest)  # a bad flag: one line, before JAX loads
    if arms_file:
      with open(arms_file, encoding='utf-8') as f:
        arms = [(a['slug'], loader.split_argv(a['flags'])[:2]) for a in json.load(f)]
    else:
      arms = [('arm', (spec, overrides))]
    loaded = [(slug, loader.load(*flags)) for slug, flags in arms]
    from configs import validation  # pylint: disable=import-outside-toplevel
    from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel

    configs = [(slug, validation.resolve(config)) for slug, config in loaded]
    for _, config in configs:
      numerics_setup.configure(config)  # before any backend starts, as in train.py
    results = measure_all(configs, steps, launched)
  except (OSError, ValueError) as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    return 2
  for slug, result in results:
    print(PREFIX + json.dumps({'slug': slug, **result}), flush=True)
  return 0


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.exit(main())
