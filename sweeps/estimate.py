"""A sweep's cost before it runs: each arm's step time measured here, times steps and runs.

  python -m sweeps.sweep --config=configs/digits.py:study --root=runs/study --estimate

For each distinct arm the sweep starts `python -m sweeps.estimate` with the arm's first run's
config flags and the environment a run gets (same devices, same compilation cache). That process
builds the run context as train.py does (trainer/run.py: build, init_model, initial_state,
enter_phase), and for every training phase times `--steps` steps after the first (which compiles)
on the run's real batches (host input feeding included; one wait for the device at the end, as
in training); then one full evaluation after a warm-up evaluation. It prints one line `estimate: {json}`.

  seconds per run = Σ phases (steps in the phase × seconds per step)
                    + evaluations per run × seconds per evaluation
  device-hours    = Σ arms (runs of the arm × devices per run × seconds per run) / 3600

Included: training steps and evaluation passes, as measured on this machine's devices. Not included:
compilation (shown separately: each run compiles once per phase unless the shared compilation
cache has the program), process start-up, data preparation and checkpoint writes. Run the estimate
on the kind of machine the runs will use: the step times are this machine's.
"""

import collections
import json
import subprocess
import sys
import time

PREFIX = 'estimate: '


def measure(config, timed_steps):
  """{'platform', 'device_kind', 'devices', 'phases': [{name, steps, step_s, compile_s}],
  'evaluations', 'evaluation_s', 'evaluation_compile_s'} for `config` on this machine."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import run  # pylint: disable=import-outside-toplevel
  ctx = run.build(config)
  model, _ = run.init_model(ctx)
  state = run.initial_state(ctx, model)
  phases = []
  for phase in ctx.phases:
    state, step_fn = run.enter_phase(ctx, state, phase, phase.start)
    count = min(timed_steps + 1, phase.stop - phase.start)
    batches = run.batches(ctx, phase.start, phase.start + count)
    start = time.perf_counter()
    state = jax.block_until_ready(step_fn(state, next(batches)))  # compiles
    first = time.perf_counter() - start
    start, timed = time.perf_counter(), 0
    for batch in batches:
      state, timed = step_fn(state, batch), timed + 1
    state = jax.block_until_ready(state)
    step_s = (time.perf_counter() - start) / timed if timed else first
    phases.append({'name': phase.name, 'steps': phase.stop - phase.start, 'step_s': step_s,
                   'compile_s': max(first - step_s, 0.0)})
  eval_fn = run.eval_step(ctx, state)
  times = []
  for _ in range(2):
    start = time.perf_counter()
    run.evaluate(ctx, eval_fn, state)
    times.append(time.perf_counter() - start)
  per_epoch, epochs = ctx.per_epoch, config.num_epochs
  evaluations = sum(run.due(ctx, e * per_epoch).evaluate for e in range(1, epochs + 1))
  facts = run.facts()
  return {'platform': facts['platform'], 'device_kind': facts['device_kind'],
          'devices': facts['num_devices'], 'phases': phases, 'evaluations': evaluations,
          'evaluation_s': times[1], 'evaluation_compile_s': max(times[0] - times[1], 0.0)}


def seconds_per_run(m):
  return (sum(p['steps'] * p['step_s'] for p in m['phases'])
          + m['evaluations'] * m['evaluation_s'])


def device_hours(arms):
  """Σ arms runs × devices × seconds per run / 3600, from [(slug, runs, measurement)]."""
  return sum(n * m['devices'] * seconds_per_run(m) for _, n, m in arms) / 3600


def table(arms):
  """The per-arm lines and the total, as printed by the sweep."""
  lines = [f'{"arm":<28} {"runs":>4} {"steps/run":>9} {"s/step by phase":>22} '
           f'{"evals x s":>12} {"s/run":>9} {"device-h":>9}']
  for slug, n, m in arms:
    per_step = ', '.join(f'{p["name"]} {p["step_s"]:.4g}' for p in m['phases'])
    steps = sum(p['steps'] for p in m['phases'])
    hours = device_hours([(slug, n, m)])
    lines.append(f'{slug:<28} {n:>4} {steps:>9} {per_step:>22} '
                 f'{m["evaluations"]:>4} x {m["evaluation_s"]:<5.3g} {seconds_per_run(m):>9.1f} '
                 f'{hours:>9.4g}')
  return lines


def compile_seconds(m):
  return sum(p['compile_s'] for p in m['phases']) + m['evaluation_compile_s']


def summary(arms):
  """The total device-hours with its formula, what it includes, and the bound with compilation."""
  first = arms[0][2]
  runs = sum(n for _, n, _ in arms)
  hours = device_hours(arms)
  compiled = sum(n * m['devices'] * compile_seconds(m) for _, n, m in arms) / 3600
  return [
      f'total: {hours:.4g} device-hours for {runs} runs on {first["devices"]} x '
      f'{first["device_kind"]} ({first["platform"]}) per run',
      '  = Σ arms runs × devices × (Σ phases steps × s/step + evaluations × s/evaluation) / 3600',
      '  includes: training steps (host input feeding included) and evaluation passes, measured '
      'here after compilation (mean over the timed steps)',
      '  not included: process start-up, data preparation, checkpoint writes, and compilation: '
      f'{hours + compiled:.4g} device-hours if every run compiled as measured here '
      '(an upper bound: runs of an arm share compiles through the compilation cache)']


def measure_arm(flags, env, repo, timed_steps):
  """Run `python -m sweeps.estimate` for one arm; its measurement, or raise ValueError."""
  argv = [sys.executable, '-m', 'sweeps.estimate', *flags, f'--steps={timed_steps}']
  proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False)
  found = [l[len(PREFIX):] for l in proc.stdout.splitlines() if l.startswith(PREFIX)]
  if proc.returncode or not found:
    lines = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
    raise ValueError(lines[-1] if lines else f'exit code {proc.returncode}')
  return json.loads(found[-1])


def report(runs, flags_of, env, repo, timed_steps):
  """Measure each distinct arm (its first run's config flags, loaded by the arm's own process as
  train.py would) and print the table; returns an exit code (2 if an arm cannot be measured)."""
  firsts, counts = {}, collections.Counter(r.slug for r in runs)
  for r in runs:
    firsts.setdefault(r.slug, r)
  arms = []
  for slug, first in firsts.items():
    print(f'estimate: timing {slug} ({timed_steps} steps per phase after compiling) ...',
          flush=True)
    try:
      arms.append((slug, counts[slug], measure_arm(flags_of(first), env, repo, timed_steps)))
    except ValueError as e:
      print(f'error: --estimate: arm {slug}: {e}', file=sys.stderr)
      return 2
  print('\n'.join(table(arms) + summary(arms)), flush=True)
  return 0


def main(argv=None):
  """`python -m sweeps.estimate --config=SPEC [--config.<f>=<v> ...] [--steps=N]`."""
  from configs import loader  # pylint: disable=import-outside-toplevel
  from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel
  from trainer import validation  # pylint: disable=import-outside-toplevel
  argv = sys.argv[1:] if argv is None else argv
  spec, overrides, rest = loader.split_argv(argv)
  try:
    if any(not a.startswith('--steps=') for a in rest):
      raise ValueError(f'unexpected arguments {rest}: give --config=SPEC, --config.<field>=<value> '
                       'and --steps=N')
    steps = [int(a.split('=', 1)[1]) for a in rest] or [5]
    config = validation.resolve(loader.load(spec, overrides))
    numerics_setup.configure(config)  # before any backend starts, as in train.py
    result = measure(config, steps[-1])
  except ValueError as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    return 2
  print(PREFIX + json.dumps(result), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
