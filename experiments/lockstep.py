"""Arms and seeds of one run trained in lockstep (a seed's arms from the same initial weights, bit
for bit) and the distances between them; what each number means: docs/numerics.md."""

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from statsmodels.stats.proportion import proportion_confint

import input_pipeline
from analysis import agreement, stats
from experiments import divergence
from input_pipeline import batching
from models import resnet
from numerics import setup as numerics_setup
from trainer import metrics, run
from trainer import train as trainer  # this module's own `train` trains the lockstep

GROUPS = divergence.GROUPS
CI_LEVEL, CI_ALPHA = 0.95, 0.05
CI_NAME = '95% Wilson score interval (multilabel: over images)'
ACROSS_NAME = '95% t-Wilson interval over seeds (independent pairs)'
BAND_NAME = 'min–max over seeds'


class Progress:
  """Timed lines from the first second, then every `interval` s: steps, steps/s, the ETA."""

  def __init__(self, log=None, interval=10.0, clock=time.time):
    self.log, self.interval, self.clock = log or (lambda _: None), interval, clock
    self.start = self.last = clock()
    self.since = None  # (time, step) where the last compile ended

  def say(self, text):
    self.last = self.clock()
    self.log(f'[{metrics.duration(self.last - self.start)}] {text}')

  def compiled(self, step):
    """The steps before `step` included a compile: the rate counts from here."""
    self.since = (self.clock(), step)

  def rate(self, step, total):
    now = self.clock()
    if self.since is None or step <= self.since[1] or now <= self.since[0]:
      return f'step {step}/{total}, steps/s: measuring (compiling)'
    per_s = (step - self.since[1]) / (now - self.since[0])
    eta = metrics.duration((total - step) / per_s)
    return f'step {step}/{total}, {per_s:.3g} steps/s, ETA {eta}'

  def step(self, step, total):
    if self.clock() - self.last >= self.interval:
      self.say(self.rate(step, total))


def pair_list(seeds, names):
  """[{'kind', 'seeds': [s, s'], 'x': (s, 'a'), 'y': (s', arm)}]: what each row compares."""
  out = [
    {'kind': kind, 'seeds': [s, s], 'x': (s, 'a'), 'y': (s, kind)}
    for kind in names
    if kind != 'a'
    for s in seeds
  ]
  ring = seeds[1:] + seeds[:1] if len(seeds) > 2 else seeds[1:]  # 2 seeds: one pair, not it twice
  return out + [
    {'kind': 'ceiling', 'seeds': [s, t], 'x': (s, 'a'), 'y': (t, 'a')}
    for s, t in zip(seeds, ring, strict=False)
  ]


def prepare(configs, devices=0, progress=None):
  """Each (seed, arm)'s run context and initial state of {seed: {arm: resolved config}}."""
  progress = progress or Progress()
  if jax.process_count() > 1:
    raise ValueError('experiments.divergence runs in a single process; run it on one host')
  seeds = list(configs)
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
      what = ', data and initial weights' if host is None else ''
      progress.say(f'building seed {seed} arm {name}: run context{what}')
      ctx = run.build(config, dataset, mesh_devices)
      dataset = ctx.dataset
      if host is None:  # arm a: this seed's initial weights, for every arm of the seed
        host = jax.device_get(trainer.initial_state(ctx, run.init_model(ctx)[0]))
      fa, fb = flat(host['params']), flat(run.param_shapes(ctx))
      for k in sorted(fa.keys() | fb.keys()):  # identical initial weights need equal parameters
        da, db = (
          'absent' if v is None else f'{np.dtype(v.dtype)}{list(v.shape)}'
          for v in (fa.get(k), fb.get(k))
        )
        if da != db:
          raise ValueError(
            f'{"--control" if name == "control" else "--a/--b"}: parameter {k} is {da} in arm '
            f'a, {db} in arm {name}; identical initial weights need equal parameters (e.g. the '
            'same numerics.param_dtype)'
          )
      key = json.dumps(config.numerics.to_dict(), sort_keys=True)
      arms[seed, name] = {'seed': seed, 'name': name, 'ctx': ctx, 'key': key}
      if name not in numerics:
        with numerics_setup.precision_scope(config):
          numerics[name] = numerics_setup.describe(config)
      # Each arm its own buffers (the steps donate them), bit-identical.
      states[seed, name] = jax.device_put(jax.tree.map(np.copy, host), ctx.replicated)
      if key not in predicts:  # eval-mode logits in the arm's numerics; one compile for all seeds
        logits = functools.partial(trainer.eval_logits, ctx.graphdef, mean=ctx.mean, std=ctx.std)
        predicts[key] = jax.jit(numerics_setup.with_precision(logits, ctx.config))
  return {
    'ctx': arms[seeds[0], 'a']['ctx'],
    'seeds': seeds,
    'names': list(configs[seeds[0]]),
    'arms': arms,
    'states': states,
    'predicts': predicts,
    'numerics': numerics,
    'pairs': pair_list(seeds, list(configs[seeds[0]])),
    'devices': len(mesh_devices),
  }


def enter_phase(lock, phase, step):
  """Each arm's state and jitted step for `phase`: arms of equal numerics share one compilation,
  whatever their seed (an argument of the step, bound per arm)."""
  shared, fns, states = {}, {}, lock['states']
  for arm_id, arm in lock['arms'].items():
    states[arm_id], fn = trainer.enter_phase(arm['ctx'], states[arm_id], phase, step)
    fns[arm_id] = dataclasses.replace(shared.setdefault(arm['key'], fn), seed=fn.seed)
  return fns


def arm_logits(lock, split, arm_id):
  """The arm's logits of `split`, in the trainer's evaluation batches (hence its eval noise)."""
  arm = lock['arms'][arm_id]
  ctx, state = arm['ctx'], lock['states'][arm_id]
  size = batching.eval_batch_size(len(split), ctx.config.eval_batch_size, ctx.mesh.devices.size)
  weights = {k: state[k] for k in ('params', 'batch_stats', 'step')}
  out = []
  for batch in batching.eval_batches(split, size):
    logits = lock['predicts'][arm['key']](weights, np.int32(arm['seed']), batch['image'])
    out.append(np.asarray(jax.device_get(logits))[batch['mask'] > 0])
  return np.concatenate(out)


def record(lock, step, probe, last_sums):
  """One row: every pair's distances now, and each arm's mean training loss since the last row."""
  task, parts = lock['ctx'].dataset.task, lock['ctx'].model_module.PARTS
  keys = ('params', 'batch_stats', 'sums')
  host = {i: jax.device_get({k: s[k] for k in keys}) for i, s in lock['states'].items()}
  logits = {i: arm_logits(lock, probe, i).astype(np.float64) for i in lock['arms']}
  pairs = {kind: [] for kind in dict.fromkeys(p['kind'] for p in lock['pairs'])}
  for p in lock['pairs']:
    x, y = p['x'], p['y']
    lx, ly = logits[x], logits[y]
    pairs[p['kind']].append(
      {
        'seeds': p['seeds'],
        **{k: param_distance(host[x][k], host[y][k], parts) for k in ('params', 'batch_stats')},
        'logits': {  # float64
          'rel_l2': norms((lx - ly).ravel(), lx.ravel())['rel_l2'],
          'max_abs': float(np.max(np.abs(lx - ly))),
          'pred_differs': agreement.churn(predictions(lx, task), predictions(ly, task)),
        },
      }
    )
  loss = {name: [] for name in lock['names']}
  for (seed, name), h in host.items():
    last = last_sums[seed, name]
    count = float(h['sums']['count']) - last['count']
    loss[name].append((float(h['sums']['loss']) - last['loss']) / count if count else None)
    last_sums[seed, name] = {k: float(v) for k, v in h['sums'].items()}
  return {'step': step, 'pairs': pairs, 'loss': loss}


def train(lock, num_steps, every, probe=256, progress=None):
  """Train every arm `num_steps` steps in lockstep; a row at 0, every `every` and at the end."""
  ctx, progress = lock['ctx'], progress or Progress()
  test = ctx.dataset.test
  probe_split = input_pipeline.Split(*(np.asarray(a[:probe]) for a in (test.images, test.labels)))
  feeds = {s: run.batches(lock['arms'][s, 'a']['ctx'], 0, num_steps) for s in lock['seeds']}
  last_sums = {i: {'loss': 0.0, 'correct': 0.0, 'count': 0.0} for i in lock['arms']}
  progress.say(
    f'compiling the evaluation pass of {len(lock["predicts"])} distinct arm(s), then the first '
    'row (step 0)'
  )
  rows, phase = [record(lock, 0, probe_split, last_sums)], None
  for step in range(num_steps):
    if phase is None or not phase.start <= step < phase.stop:
      phase = run.phase_at(ctx.phases, step)
      fns = enter_phase(lock, phase, step)
      progress.say(
        f'compiling the training step of phase {phase.name} for '
        f'{len({id(f.fn) for f in fns.values()})} distinct arm(s) (their first step)'
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
  """Each arm's test accuracy per seed and each pair kind's churn on the whole test set."""
  test, task = lock['ctx'].dataset.test, lock['ctx'].dataset.task
  preds = {i: predictions(arm_logits(lock, test, i), task) for i in lock['arms']}
  labels = np.asarray(test.labels)
  truth = labels > 0.5 if task == 'multilabel' else labels
  accuracy = {
    n: [float(np.mean(preds[s, n] == truth)) for s in lock['seeds']] for n in lock['names']
  }
  kinds = {}
  for p in lock['pairs']:
    kinds.setdefault(p['kind'], []).append(pair_churn(preds[p['x']], preds[p['y']], p['seeds']))
  return {
    'test_count': len(test),
    'accuracy': {n: band(a) | {'per_seed': a} for n, a in accuracy.items()},
    'disagreement': {kind: disagreement(ps) for kind, ps in kinds.items()},
  }


# The per-step curves: name -> the value of one pair's row.
CURVES: dict[str, Callable[[dict], Any]] = {
  'params': lambda r: r['params']['rel_l2'],
  **{
    f'params.{g}': functools.partial(lambda g, r: r['params']['groups'].get(g, {}).get('rel_l2'), g)
    for g in GROUPS
  },
  'params.max_abs': lambda r: r['params']['max_abs'],
  'batch_stats': lambda r: r['batch_stats']['rel_l2'],
  'logits': lambda r: r['logits']['rel_l2'],
  'probe_disagreement': lambda r: r['logits']['pred_differs'],
}


def flat(tree):
  """{'layer1.0.conv1.kernel': leaf, ...} in a fixed order."""
  keystr = jax.tree_util.keystr
  return {keystr(p, simple=True, separator='.'): v for p, v in jax.tree.leaves_with_path(tree)}


def norms(d, a):
  """{'rel_l2': ||d||/||a||, 'diff_norm': ||d||, 'norm_a': ||a||} of float64 vectors."""
  dd, aa = float(d @ d), float(a @ a)
  rel = math.sqrt(dd / aa) if aa else (math.inf if dd else 0.0)
  return {'rel_l2': rel, 'diff_norm': math.sqrt(dd), 'norm_a': math.sqrt(aa)}


def param_distance(pa, pb, parts=resnet.PARTS):
  """Relative L2, overall and per group (`parts`, else the top-level name), max |a-b|; float64."""
  part_of = {name: part for part, names in parts.items() for name in names}
  a = {k: np.ravel(v).astype(np.float64) for k, v in flat(pa).items()}
  fb = flat(pb)
  d = {k: v - np.ravel(fb[k]).astype(np.float64) for k, v in a.items()}
  group = {k: part_of.get(k.split('.')[0], k.split('.')[0]) for k in a}  # conv1.kernel -> stem

  def part(values, g):
    return np.concatenate([v for k, v in values.items() if group[k] == g])

  every = np.concatenate(list(d.values()))
  names = sorted(set(group.values()), key=lambda g: (GROUPS.index(g) if g in GROUPS else 9, g))
  return {
    **norms(every, np.concatenate(list(a.values()))),
    'max_abs': float(np.max(np.abs(every), initial=0.0)),
    'groups': {g: norms(part(d, g), part(a, g)) for g in names},
  }


def predictions(logits, task):
  """The argmax class, or for multilabel each label's sign."""
  logits = np.asarray(logits)
  return logits > 0 if task == 'multilabel' else np.argmax(logits, axis=-1)


def differs(pred_a, pred_b):
  """Per example: the share of its predicted labels that differ (their mean is the churn)."""
  d = np.asarray(pred_a) != np.asarray(pred_b)
  return d.reshape(d.shape[0], -1).mean(axis=1)


def pair_churn(pred_a, pred_b, seeds):
  """One pair's whole-test-set churn; with several labels per image, its interval over images."""
  shares = differs(pred_a, pred_b)
  labels = int(np.asarray(pred_a).size // max(len(shares), 1))
  count = int(round(float(shares.sum()) * labels))
  pair = {'seeds': seeds, 'count': count, 'n': int(len(shares) * labels), 'labels': labels}
  if labels > 1:
    pair['ci_low'], pair['ci_high'] = stats.proportion_mean_ci(shares)
  return pair


def band(values):
  """Mean over seeds, min, max, sd (ddof 1) and the 95% t-interval; None where undefined."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  if not x.size:
    return dict.fromkeys(('mean', 'min', 'max', 'sd', 't_low', 't_high'), None) | {'n': 0}
  sd, low, high = (
    float(v) if np.isfinite(v) else None
    for v in (x.std(ddof=1) if x.size > 1 else np.nan, *stats.t_ci(x, CI_LEVEL))
  )
  spread = {'n': int(x.size), 'mean': float(x.mean()), 'min': float(x.min()), 'max': float(x.max())}
  return {**spread, 'sd': sd, 't_low': low, 't_high': high}


def disagreement(pairs):
  """Churn per pair, across the independent pairs (t-Wilson over seeds), the band and total."""
  per_pair = []
  for p in pairs:  # the Wilson interval (statsmodels), or pair_churn's over the images
    count, n = p['count'], p['n']
    low, high = p.get('ci_low'), p.get('ci_high')
    if low is None:
      low, high = proportion_confint(count, n, alpha=CI_ALPHA, method='wilson')
    rate = count / n if n else None
    per_pair.append(
      {'seeds': p['seeds'], 'count': count, 'n': n, 'rate': rate, 'ci_low': low, 'ci_high': high}
    )
  used, kept = set(), []  # the independent pairs: (s0, s1), (s1, s2), ... keeps (s0, s1), ...
  for p in per_pair:
    if not used & set(p['seeds']):
      kept.append(p)
      used |= set(p['seeds'])
  rates = [p['rate'] for p in kept]
  low, high = stats.proportion_mean_ci(rates)
  bounded = {'t_low': float(low), 't_high': float(high)} if len(rates) > 1 else {}
  return {
    'pairs': per_pair,
    'total': {'count': sum(p['count'] for p in pairs), 'n': sum(p['n'] for p in pairs)},
    'across': {**band(rates), **bounded, 'pairs': len(kept)},
    'band': band(p['rate'] for p in per_pair),
  }
