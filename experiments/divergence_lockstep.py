"""Several arms and seeds of one run trained in lockstep through the run context (trainer/run.py).

Arms: 'a', 'b' and optionally 'control' (arm a's numerics plus the control's overrides), each a
run context built from its config as train.py builds one. For every seed the initial weights are
computed once (arm a's init for that seed) and copied bit for bit to that seed's arms; all of a
seed's arms train on batch `step` of that seed's data order, through the run context's phases
(optimizer resets included) and jitted steps, each traced under its arm's numerics. Arm a of two
seeds differs in initial weights and data order: the ceiling pair.

Pairs compared (always arm a first; distances relative to it):
  'b'        a vs b, same seed;  'control'  a vs control, same seed;
  'ceiling'  a with seed s vs a with the next seed of the list (cyclic from 3 seeds on).
Reference: docs/numerics.md "Experiments on the numerics".
"""

import json
import time

import jax
import numpy as np

from experiments import divergence_measure as measure
from input_pipeline import base, batching
from numerics import setup as numerics_setup
from trainer import optim, run, steps, writers


def pair_list(seeds, names):
  """[{'kind', 'seeds': [s, s'], 'x': (s, 'a'), 'y': (s', arm)}]: what each row compares."""
  out = [
    {'kind': kind, 'seeds': [s, s], 'x': (s, 'a'), 'y': (s, kind)}
    for kind in names
    if kind != 'a'
    for s in seeds
  ]
  links = len(seeds) if len(seeds) > 2 else len(seeds) - 1  # 2 seeds: one pair, not it twice
  out += [
    {
      'kind': 'ceiling',
      'seeds': [seeds[i], seeds[(i + 1) % len(seeds)]],
      'x': (seeds[i], 'a'),
      'y': (seeds[(i + 1) % len(seeds)], 'a'),
    }
    for i in range(links)
  ]
  return out


def check_same_params(host_params, abstract_params, name):
  """One-line ValueError unless arm `name`'s parameters have arm a's names, shapes and dtypes."""
  fa, fb = measure.flat(host_params), measure.flat(abstract_params)

  def desc(value):
    return 'absent' if value is None else f'{np.dtype(value.dtype)}{list(value.shape)}'

  flag = '--control' if name == 'control' else '--a/--b'
  for key in sorted(fa.keys() | fb.keys()):
    if desc(fa.get(key)) != desc(fb.get(key)):
      raise ValueError(
        f'{flag}: parameter {key} is {desc(fa.get(key))} in arm a, '
        f'{desc(fb.get(key))} in arm {name}; identical initial weights need equal '
        'parameters (e.g. the same numerics.param_dtype)'
      )


def make_predict(ctx):
  """jit({'params', 'batch_stats', 'step'}, seed, uint8 images) -> eval-mode f32 logits in the
  arm's numerics: the trainer's evaluation forward pass (steps.eval_logits), so a noisy format
  draws the noise the trainer's evaluation of that run and step draws. The seed is an argument:
  one compilation serves every seed."""

  def logits(state, seed, images):
    return steps.eval_logits(ctx.graphdef, state, seed, images, ctx.mean, ctx.std)

  return jax.jit(numerics_setup.with_precision(logits, ctx.config))


def predict(fn, state, seed, split, batch_size):
  """Logits of every example of `split` (numpy), in order, in the trainer's evaluation batches
  (batching.eval_batches: the last one padded, one shape)."""
  weights = {k: state[k] for k in ('params', 'batch_stats', 'step')}
  out = []
  for batch in batching.eval_batches(split, batch_size):
    logits = fn(weights, np.int32(seed), batch['image'])
    out.append(np.asarray(jax.device_get(logits))[batch['mask'] > 0])
  return np.concatenate(out)


class Progress:
  """Progress lines on `log` from the first second: what is being built or compiled (each line
  with the time since the start), then at least every `interval` seconds while training: steps
  done, steps/s over the steps since the last compile ended, and the ETA at that rate."""

  def __init__(self, log=None, interval=10.0, clock=time.time):
    self.log, self.interval, self.clock = log or (lambda _: None), interval, clock
    self.start = self.last = clock()
    self.since = None  # (time, step) where the last compile ended

  def say(self, text):
    self.last = self.clock()
    self.log(f'[{writers.duration(self.last - self.start)}] {text}')

  def compiled(self, step):
    """The steps before `step` included a compile: the rate counts from here."""
    self.since = (self.clock(), step)

  def rate(self, step, total):
    """'step s/T, X steps/s, ETA ...' (the rate once a step after the last compile has run)."""
    now = self.clock()
    if self.since is None or step <= self.since[1] or now <= self.since[0]:
      return f'step {step}/{total}, steps/s: measuring (compiling)'
    per_s = (step - self.since[1]) / (now - self.since[0])
    eta = writers.duration((total - step) / per_s)
    return f'step {step}/{total}, {per_s:.3g} steps/s, ETA {eta}'

  def step(self, step, total):
    if self.clock() - self.last >= self.interval:
      self.say(self.rate(step, total))


def prepare(configs, devices=0, progress=None):
  """The lockstep: every (seed, arm)'s run context and initial state, and the pairs to compare.

  `configs`: {seed: {'a': config, 'b': config[, 'control': config]}}, resolved configs whose
  `seed` is that seed (experiments/divergence.py resolves them)."""
  progress = progress or Progress()
  if jax.process_count() > 1:
    raise ValueError('experiments.divergence runs in a single process; run it on one host')
  seeds = list(configs)
  names = list(configs[seeds[0]])
  available, config_a = jax.local_devices(), configs[seeds[0]]['a']
  if not 0 <= devices <= len(available) or config_a.batch_size % (devices or len(available)):
    raise ValueError(
      f'--devices={devices}: give 0 (all {len(available)}) or 1..{len(available)}, '
      f'dividing config.batch_size={config_a.batch_size}'
    )
  mesh_devices, dataset = available[: devices or len(available)], None
  arms, states, predicts, numerics = {}, {}, {}, {}
  for seed in seeds:
    host = None
    for name, config in configs[seed].items():  # the test split (data.split_seed) is shared
      progress.say(
        f'building seed {seed} arm {name}: run context'
        + (', data and initial weights' if host is None else '')
      )
      ctx = run.build(config, dataset, mesh_devices)
      dataset = ctx.dataset
      if host is None:  # arm a: this seed's initial weights, for every arm of the seed
        host = jax.device_get(run.initial_state(ctx, run.init_model(ctx)[0]))
      check_same_params(host['params'], run.param_shapes(ctx), name)
      key = json.dumps(config.numerics.to_dict(), sort_keys=True)
      arms[seed, name] = {'seed': seed, 'name': name, 'ctx': ctx, 'key': key}
      if name not in numerics:
        with numerics_setup.precision_scope(config):
          numerics[name] = numerics_setup.describe(config)
      # Each arm its own buffers (the steps donate them), bit-identical.
      states[seed, name] = jax.device_put(jax.tree.map(np.copy, host), ctx.replicated)
      predicts.setdefault(key, make_predict(ctx))
  return {
    'ctx': arms[seeds[0], 'a']['ctx'],
    'seeds': seeds,
    'names': names,
    'arms': arms,
    'states': states,
    'predicts': predicts,
    'numerics': numerics,
    'pairs': pair_list(seeds, names),
    'devices': len(mesh_devices),
  }


def enter_phase(lock, phase, step):
  """Each arm's state and jitted step for `phase` from its run context (arms of one seed with
  equal numerics share one compiled step)."""
  shared, fns = {}, {}
  for arm_id, arm in lock['arms'].items():
    lock['states'][arm_id], fn = run.enter_phase(arm['ctx'], lock['states'][arm_id], phase, step)
    fns[arm_id] = shared.setdefault((arm['seed'], arm['key']), fn)
  return fns


def batches(lock, seed, start, stop):
  """Training batches of steps [start, stop) in `seed`'s data order, as the trainer feeds them
  (run.batches: sharded over the mesh, prefetched)."""
  return run.batches(lock['arms'][seed, 'a']['ctx'], start, stop)


def arm_logits(lock, split, arm_id):
  """The arm's logits of `split` in the batches the trainer's evaluation would use for it
  (batching.eval_batch_size: the test split's are run.eval_batch's, hence its eval noise)."""
  arm = lock['arms'][arm_id]
  ctx = arm['ctx']
  size = batching.eval_batch_size(len(split), ctx.config.eval_batch_size, ctx.mesh.devices.size)
  return predict(lock['predicts'][arm['key']], lock['states'][arm_id], arm['seed'], split, size)


def record(lock, step, probe, last_sums):
  """One row: every pair's distances now, and each arm's mean training loss since the last row."""
  task = lock['ctx'].dataset.task
  host = {
    i: jax.device_get({k: s[k] for k in ('params', 'batch_stats', 'sums')})
    for i, s in lock['states'].items()
  }
  logits = {i: arm_logits(lock, probe, i) for i in lock['arms']}
  pairs = {kind: [] for kind in dict.fromkeys(p['kind'] for p in lock['pairs'])}
  for p in lock['pairs']:
    x, y = p['x'], p['y']
    pairs[p['kind']].append(
      {
        'seeds': p['seeds'],
        **{k: measure.param_distance(host[x][k], host[y][k]) for k in ('params', 'batch_stats')},
        'logits': measure.logit_distance(logits[x], logits[y], task),
      }
    )
  loss = {name: [] for name in lock['names']}
  for (seed, name), h in host.items():
    count = float(h['sums']['count']) - last_sums[seed, name]['count']
    loss[name].append(
      (float(h['sums']['loss']) - last_sums[seed, name]['loss']) / count if count else None
    )
    last_sums[seed, name] = {k: float(v) for k, v in h['sums'].items()}
  return {'step': step, 'pairs': pairs, 'loss': loss}


def train(lock, num_steps, every, probe=256, progress=None):
  """Train every arm `num_steps` steps in lockstep; a row at 0, every `every` (>= 1) and the end.
  `progress` (a Progress) says what compiles, and the rate and ETA as steps run."""
  ctx, progress = lock['ctx'], progress or Progress()
  if num_steps < 1 or num_steps > ctx.total_steps:
    raise ValueError(
      f'--steps={num_steps}: give 1..{ctx.total_steps} (the config trains '
      f'{ctx.total_steps} steps; more need a larger --config.num_epochs)'
    )
  test = ctx.dataset.test
  probe_split = base.Split(np.asarray(test.images[:probe]), np.asarray(test.labels[:probe]))
  feeds = {seed: batches(lock, seed, 0, num_steps) for seed in lock['seeds']}
  last_sums = {i: {'loss': 0.0, 'correct': 0.0, 'count': 0.0} for i in lock['arms']}
  progress.say(
    f'compiling the evaluation pass of {len(lock["predicts"])} distinct arm(s), then '
    'the first row (step 0)'
  )
  rows, phase = [record(lock, 0, probe_split, last_sums)], None
  for step in range(num_steps):
    if phase is None or not phase.start <= step < phase.stop:
      phase = optim.phase_at(ctx.phases, step)
      fns = enter_phase(lock, phase, step)
      progress.say(
        f'compiling the training step of phase {phase.name} for '
        f'{len(set(map(id, fns.values())))} arm(s) (their first step)'
      )
    for seed in lock['seeds']:
      batch = next(feeds[seed])
      for name in lock['names']:
        lock['states'][seed, name] = fns[seed, name](lock['states'][seed, name], batch)
    if step == phase.start:
      progress.compiled(step + 1)
    if (step + 1) % every == 0 or step + 1 == num_steps:
      rows.append(r := record(lock, step + 1, probe_split, last_sums))
      b = r['pairs']['b']
      progress.say(
        f'{progress.rate(step + 1, num_steps)} ({phase.name}): a vs b params '
        f'{np.mean([p["params"]["rel_l2"] for p in b]):.3e}, logits '
        f'{np.mean([p["logits"]["rel_l2"] for p in b]):.3e} (mean of {len(b)} seeds)'
      )
    else:
      progress.step(step + 1, num_steps)
  return rows


def final_test(lock):
  """At the end: each arm's test accuracy per seed and each pair kind's churn, the share of
  predicted labels that differ, over the whole test set (measure.pair_churn,
  measure.disagreement)."""
  test, task = lock['ctx'].dataset.test, lock['ctx'].dataset.task
  preds = {i: measure.predictions(arm_logits(lock, test, i), task) for i in lock['arms']}
  labels = np.asarray(test.labels)
  truth = labels > 0.5 if task == 'multilabel' else labels

  def correct(predicted):
    return np.mean(predicted == truth)

  accuracy = {
    name: [float(correct(preds[s, name])) for s in lock['seeds']] for name in lock['names']
  }
  kinds = {}
  for p in lock['pairs']:
    kinds.setdefault(p['kind'], []).append(
      measure.pair_churn(preds[p['x']], preds[p['y']], p['seeds'])
    )
  return {
    'test_count': len(test),
    'accuracy': {n: measure.band(a) | {'per_seed': a} for n, a in accuracy.items()},
    'disagreement': {kind: measure.disagreement(ps) for kind, ps in kinds.items()},
  }
