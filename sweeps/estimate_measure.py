"""A sweep's cost, measured in one process (`python -m sweeps.estimate --arms=FILE`, started by
sweeps/estimate.py): what train.py does for each arm timed here, start-up, compiles (cold and as
a cache load), steps per phase, an evaluation and a checkpoint.
"""

import functools
import hashlib
import json
import tempfile
import time

# JAX and the trainer are imported inside the functions that measure: the sweep imports
# sweeps/estimate.py (and so this module) to start the measuring processes, which needs neither.


PROGRESS = 'estimate: '


def _timed(fn):
  """(seconds, result) of fn(), waiting for the devices."""
  import jax

  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def _phase(ctx, state, phase, timed_steps, programs=None, say=print):
  """(state, {name, steps, step_s, compile_s, cached_compile_s, program}) of one training phase;
  `programs` ({HLO fingerprint: measurement}) shares the measurement of a step this process has
  measured already that lowers to the same program (nothing is then compiled or run)."""
  import jax

  from trainer import run

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
  import jax

  from input_pipeline import batching
  from trainer import run, steps

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
  from trainer import checkpointing, loop

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
  from trainer import cadence, execution, run

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


def say_progress(slug, what):
  """One progress line of arm `slug` on stdout (measure_group reads them as they come)."""
  print(f'{PROGRESS}{slug}: {what}', flush=True)


def measure_all(arms, timed_steps, launched):
  """[(slug, measurement)] of several arms ([(slug, resolved config)], one set of XLA flags)
  measured in this process: the start-up is the first arm's (a run pays it once, whatever the
  arm), the data is loaded once per data config, each training program is measured once."""
  out, programs, contexts = [], {}, {}
  for slug, config in arms:
    say = functools.partial(say_progress, slug)
    data = json.dumps(config.data.to_dict(), sort_keys=True, default=str)
    begin = time.time()
    measured, contexts[data] = _measure(
      config, timed_steps, launched if not out else begin, programs, say, contexts.get(data)
    )
    if out:  # this arm's own set-up, plus the process start it did not pay here
      measured['startup_s'] += out[0][1]['startup_s']
    out.append((slug, measured))
  return out
