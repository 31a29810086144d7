"""One training run under two numerics settings in lockstep: how far apart do the models drift?

  python -m experiments.divergence --config=configs/digits.py:cpu --a numerics.emulate=f32 \
      --b numerics.emulate=bf16 --steps 100 --every 10 --out runs/divergence

`--a`/`--b`: `numerics.<field>=<value>[,...]` (prefix optional); no `--b`: b = a, a determinism
check (exactly zero distance at every step, else exit code 1); `--config.<field>=<v>`: both arms.
Each arm is a run context (trainer/run.py) built from its config, as train.py builds one: the
weights are initialised once (arm a, the trainer's init) and copied bit for bit to both arms; both
train on batch `step` of the trainer's data order through the run context's phases (optimizer
resets included) and jitted steps, each traced under its own arm's numerics.
Rows at step 0, every `--every` steps and the last: ||θa-θb||/||θa|| overall and per group (stem,
layer1..4, head; float64), max |θa-θb|, eval-mode logits on the first `--probe` test images
(||La-Lb||/||La||; fraction whose argmax, or for multilabel any label's sign, differs), each arm's
mean training loss since the previous row. Writes divergence.{json,md,png,pdf} to --out.
"""

import argparse
import json
import math
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

from analysis import style
from configs import loader
from input_pipeline import batching
from models import resnet
from numerics import setup as numerics_setup
from trainer import optim, run, steps

GROUPS = ('stem', 'layer1', 'layer2', 'layer3', 'layer4', 'head')
PART_OF = {name: part for part, names in resnet.PARTS.items() for name in names}  # conv1 -> stem


def parse_setting(flag, text):
  """'numerics.emulate=bf16,compute_dtype=bfloat16' -> {'numerics.emulate': 'bf16', ...}."""
  out = {}
  for item in filter(None, (s.strip() for s in (text or '').split(','))):
    key, eq, value = (s.strip() for s in item.partition('='))
    if not eq or not key or not value:
      raise ValueError(f'{flag}={text}: give numerics.<field>=<value> pairs, e.g. '
                       f'{flag} numerics.emulate=bf16')
    key = key if '.' in key else f'numerics.{key}'
    if not key.startswith('numerics.') or key.count('.') != 1:
      raise ValueError(f'{flag}: {key} is not a numerics field; arms differ only in numerics.*, '
                       f'set other fields for both with --config.{key}=...')
    if key in ('numerics.gpu_deterministic', 'numerics.xla_flags'):  # XLA flags of the process
      raise ValueError(f'{flag}: {key} is process-wide; set it for both with --config.{key}=...')
    out[key] = value  # text: typed like the field by configs/loader.py
  return out


def load_config(spec, overrides=()):
  """`configs/x.py:preset,...` plus `--config.<field>=<value>` overrides (configs/loader.py)."""
  config = loader.load(spec)
  for key, value in overrides:
    try:
      loader.apply_overrides(config, [(key, value)])
    except ValueError as e:
      raise ValueError(f'--config.{key}: {str(e).splitlines()[0]}') from None
  run.validation.check_config(config)  # one-line ConfigError (a ValueError) naming the field
  return config


def arm_config(config, overrides, flag):
  """A validated copy of `config` with the arm's numerics overrides."""
  try:
    config = loader.apply_overrides(config.copy_and_resolve_references(), overrides.items())
    numerics_setup.validate(config)
  except ValueError as e:
    raise ValueError(f'{flag}: {str(e).splitlines()[0]}') from None
  return config


def flat(tree):
  """{'layer1.0.conv1.kernel': leaf, ...} in a fixed order."""
  return {'.'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_same_params(host_params, abstract_params):
  """One-line ValueError unless arm b's parameters have arm a's names, shapes and dtypes."""
  fa, fb = flat(host_params), flat(abstract_params)
  desc = lambda v: 'absent' if v is None else f'{np.dtype(v.dtype)}{list(v.shape)}'
  for name in sorted(fa.keys() | fb.keys()):
    if desc(fa.get(name)) != desc(fb.get(name)):
      raise ValueError(f'--a/--b: parameter {name} is {desc(fa.get(name))} in arm a, '
                       f'{desc(fb.get(name))} in arm b; identical initial weights need equal '
                       'parameters (e.g. the same numerics.param_dtype)')


def make_probe(ctx):
  """jit(params, batch_stats, uint8 images) -> eval-mode f32 logits, in the arm's numerics."""
  def logits(params, batch_stats, images):
    model = nnx.merge(ctx.graphdef, params, batch_stats)
    model.eval()
    return model(steps.preprocess(images, ctx.mean, ctx.std))
  return jax.jit(numerics_setup.with_precision(logits, ctx.config))


def prepare(config_a, config_b, devices=0):
  """Both arms' run contexts and their bit-identical initial states (the lockstep's context)."""
  if jax.process_count() > 1:
    raise ValueError('experiments.divergence runs in a single process; run it on one host')
  available = jax.local_devices()
  if not 0 <= devices <= len(available) or config_a.batch_size % (devices or len(available)):
    raise ValueError(f'--devices={devices}: give 0 (all {len(available)}) or 1..{len(available)}, '
                     f'dividing config.batch_size={config_a.batch_size}')
  mesh_devices = available[:devices or len(available)]
  ctx_a = run.build(config_a, devices=mesh_devices)
  model, _ = run.init_model(ctx_a)
  host = jax.device_get(steps.init_state(model, run.optimizer(ctx_a, ctx_a.phases[0])))
  arms, states, probes = {}, {}, {}
  for name, config in (('a', config_a), ('b', config_b)):
    ctx = ctx_a if name == 'a' else run.build(config, ctx_a.dataset, mesh_devices)
    check_same_params(host['params'], run.param_shapes(ctx))
    key = json.dumps(config.numerics.to_dict(), sort_keys=True)
    arms[name] = {'name': name, 'ctx': ctx, 'key': key}
    with numerics_setup.precision_scope(config):
      arms[name]['numerics'] = numerics_setup.describe(config)
    # Each arm its own buffers (the steps donate them), bit-identical.
    states[name] = jax.device_put(jax.tree.map(np.copy, host), ctx.replicated)
    probes.setdefault(key, make_probe(ctx))
  return {'ctx': ctx_a, 'arms': arms, 'states': states, 'probes': probes,
          'devices': len(mesh_devices)}


def enter_phase(lock, phase, step):
  """Each arm's state and jitted step for `phase` from the run context (arms with equal numerics
  share one compiled step)."""
  shared, fns = {}, {}
  for name, arm in lock['arms'].items():
    lock['states'][name], fn = run.enter_phase(arm['ctx'], lock['states'][name], phase, step)
    fns[name] = shared.setdefault(arm['key'], fn)
  return fns


def global_batch(lock, step):
  """Training batch `step` (the trainer's data order), sharded over the mesh."""
  ctx = lock['ctx']
  c = ctx.config
  return batching.to_global(batching.train_batch(ctx.dataset.train, c.batch_size, c.seed, step),
                            ctx.sharded)


def norms(d, a):
  """{'rel_l2': ||d||/||a||, 'diff_norm': ||d||, 'norm_a': ||a||} of float64 vectors."""
  dd, aa = float(d @ d), float(a @ a)
  return {'rel_l2': math.sqrt(dd / aa) if aa else (math.inf if dd else 0.0),
          'diff_norm': math.sqrt(dd), 'norm_a': math.sqrt(aa)}


def param_distance(pa, pb):
  """Over all parameters (one concatenated vector) and per group, max |a-b|; float64."""
  a = {k: np.ravel(v).astype(np.float64) for k, v in flat(pa).items()}
  fb = flat(pb)
  d = {k: v - np.ravel(fb[k]).astype(np.float64) for k, v in a.items()}
  top = lambda k: PART_OF.get(k.split('.')[0], k.split('.')[0])
  names = sorted({top(k) for k in a}, key=lambda g: (GROUPS.index(g) if g in GROUPS else 9, g))
  part = lambda vs, g: np.concatenate([v for k, v in vs.items() if top(k) == g])
  everything = lambda vs: np.concatenate(list(vs.values()))
  return {**norms(everything(d), everything(a)),
          'max_abs': float(np.max(np.abs(everything(d)), initial=0.0)),
          'groups': {g: norms(part(d, g), part(a, g)) for g in names}}


def logit_distance(la, lb, task):
  """||La-Lb||/||La||, max |La-Lb| and the fraction of examples whose prediction differs."""
  la, lb = np.asarray(la, np.float64), np.asarray(lb, np.float64)
  d = la - lb
  differs = (np.any((la > 0) != (lb > 0), axis=-1) if task == 'multilabel'
             else np.argmax(la, axis=-1) != np.argmax(lb, axis=-1))
  return {'rel_l2': norms(d.ravel(), la.ravel())['rel_l2'],
          'max_abs': float(np.max(np.abs(d))), 'pred_differs': float(np.mean(differs))}


def record(lock, step, probe_images, last_sums):
  """One row: distances between the arms' current states and each arm's recent mean loss."""
  host = {n: jax.device_get({k: s[k] for k in ('params', 'batch_stats', 'sums')})
          for n, s in lock['states'].items()}
  logits = {}
  for name, arm in lock['arms'].items():
    s = lock['states'][name]
    logits[name] = lock['probes'][arm['key']](s['params'], s['batch_stats'], probe_images)
  row = {'step': step, **{k: param_distance(host['a'][k], host['b'][k])
                          for k in ('params', 'batch_stats')},
         'logits': logit_distance(logits['a'], logits['b'], lock['ctx'].dataset.task)}
  for name, h in host.items():
    count = float(h['sums']['count']) - last_sums[name]['count']
    row[f'loss_{name}'] = ((float(h['sums']['loss']) - last_sums[name]['loss']) / count
                           if count else None)
    last_sums[name] = {k: float(v) for k, v in h['sums'].items()}
  return row


def train(lock, num_steps, every, probe=256, log=None):
  """Train both arms `num_steps` steps in lockstep; a row at 0, every `every` (>= 1) and the end."""
  ctx = lock['ctx']
  if num_steps < 1 or num_steps > ctx.total_steps:
    raise ValueError(f'--steps={num_steps}: give 1..{ctx.total_steps} (the config trains '
                     f'{ctx.total_steps} steps; more need a larger --config.num_epochs)')
  probe_images = np.asarray(ctx.dataset.test.images[:probe])
  last_sums = {n: {'loss': 0.0, 'correct': 0.0, 'count': 0.0} for n in lock['arms']}
  rows, phase, start = [record(lock, 0, probe_images, last_sums)], None, time.time()
  for step in range(num_steps):
    if phase is None or not phase.start <= step < phase.stop:
      phase = optim.phase_at(ctx.phases, step)
      fns = enter_phase(lock, phase, step)
    batch = global_batch(lock, step)
    for name in lock['arms']:
      lock['states'][name] = fns[name](lock['states'][name], batch)
    if (step + 1) % every == 0 or step + 1 == num_steps:
      rows.append(r := record(lock, step + 1, probe_images, last_sums))
      (log or (lambda _: None))(
          f'step {step + 1}/{num_steps} ({phase.name}): params {r["params"]["rel_l2"]:.3e}, '
          f'logits {r["logits"]["rel_l2"]:.3e} ({time.time() - start:.0f} s)')
  return rows


def table_rows(result):
  """The Markdown table's rows (strings)."""
  fmt = lambda x, spec='.2e': '–' if x is None else format(x, spec)
  return [{'step': str(r['step']), '‖Δθ‖/‖θa‖': fmt(r['params']['rel_l2']),
           **{g: fmt(v['rel_l2']) for g, v in r['params']['groups'].items()},
           'max\\|Δθ\\|': fmt(r['params']['max_abs']),
           'logits ‖ΔL‖/‖La‖': fmt(r['logits']['rel_l2']),
           'preds differ': fmt(r['logits']['pred_differs'], '.3f'),
           'loss a': fmt(r['loss_a'], '.4f'), 'loss b': fmt(r['loss_b'], '.4f')}
          for r in result['records']]


def markdown(result):
  """The report: arms, their effective numerics, and the table."""
  arms, info = result['arms'], result['info']
  lines = [f"# Divergence: a = {arms['a']['label']} vs b = {arms['b']['label']}\n",
           f"{info['config_spec']}, seed {info['seed']}, {info['platform']} "
           f"({info['device_kind']}), {info['devices']} device(s), probe of {info['probe']} test "
           'images.\n']
  for name in 'ab':
    e = arms[name]['numerics']['effective']
    lines.append(f"- arm {name}: conv {e['conv_format']}, dense {e['dense_format']}, precision "
                 f"{e['matmul_precision_flag']}, compute {e['compute_dtype']}, BN {e['batchnorm']}")
  lines.append('\nDistances relative to arm a; logits in eval mode; loss: mean since last row.\n')
  return '\n'.join(lines) + '\n' + style.markdown(table_rows(result))


def figure(result, out_dir):
  """Log-scale distance vs step, one panel per metric, and both arms' loss; PNG + PDF."""
  style.apply()
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  recs, x = result['records'], [r['step'] for r in result['records']]
  series = lambda f: np.array([np.nan if f(r) is None else f(r) for r in recs], float)
  one = lambda what, key: {'all': series(lambda r: r[what][key])}
  panels = [('parameters ‖θa−θb‖/‖θa‖', {**one('params', 'rel_l2'), **{
                g: series(lambda r, g=g: r['params']['groups'].get(g, {}).get('rel_l2'))
                for g in GROUPS}}),
            ('max |θa−θb|', one('params', 'max_abs')),
            ('probe logits ‖La−Lb‖/‖La‖', one('logits', 'rel_l2')),
            ('probe predictions differing', one('logits', 'pred_differs')),
            ('BN running stats ‖Δ‖/‖a‖', one('batch_stats', 'rel_l2'))]
  fig, axes = plt.subplots(2, 3, figsize=(style.WIDTH_IN, 4.0), constrained_layout=True)
  axes, colors = axes.ravel(), dict(zip(GROUPS, style.PALETTE))
  for ax, (title, lines) in zip(axes, panels):
    for name, y in lines.items():  # zeros cannot be drawn on a log axis: left out
      ax.plot(x, np.where(y > 0, y, np.nan), marker='.', ms=3, label=name,
              color=colors.get(name, 'black'), lw=1.6 if name == 'all' else 0.9)
    if any(np.any(y > 0) for y in lines.values()):
      ax.set_yscale('log')
    else:
      ax.text(0.5, 0.85, 'exactly 0 at every step', ha='center', transform=ax.transAxes)
    ax.set(title=title, xlabel='step', xlim=(0, max(x[-1], 1)))
  axes[0].legend(ncol=2, loc='lower right', fontsize=6, handlelength=1)
  names = {n: f"{n}: {result['arms'][n]['label']}" for n in 'ab'}
  arm_colors = style.arm_colors(names.values())
  for n, text in names.items():
    axes[5].plot(x, series(lambda r, n=n: r[f'loss_{n}']), marker='.', ms=3, label=text,
                 color=arm_colors[text], ls='-' if n == 'a' else '--')
  axes[5].set(title='train loss (mean since last row)', xlabel='step')
  axes[5].legend()
  return style.save(fig, out_dir, 'divergence')


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m experiments.divergence',
                              description=__doc__.split('\n')[0])
  p.add_argument('--config', required=True, help='config file and presets: configs/digits.py:cpu')
  p.add_argument('--a', required=True, help='arm a: numerics.<field>=<value>[,...]')
  p.add_argument('--b', default=None, help='arm b (default: the same as --a, a determinism check)')
  p.add_argument('--steps', type=int, default=100, help='training steps of both arms')
  p.add_argument('--every', type=int, default=10, help='steps between rows')
  p.add_argument('--probe', type=int, default=256, help='test images in the fixed probe batch')
  p.add_argument('--devices', type=int, default=0, help='data-parallel devices (0: all)')
  p.add_argument('--out', default='runs/divergence', help='folder for the table, JSON and figure')
  p.error = fail  # one line, not argparse's usage block
  args, rest = p.parse_known_args(argv)
  for flag in ('steps', 'every', 'probe'):
    if getattr(args, flag) < 1:
      fail(f'--{flag}={getattr(args, flag)}: give a positive integer')
  for item in rest:
    if not item.startswith('--config.') or '=' not in item:
      fail(f'unrecognized argument {item}: set config fields as --config.<field>=<value>')
  return args, [tuple(item[len('--config.'):].split('=', 1)) for item in rest]


def fail(message):
  """A one-line error on stderr, exit code 2 (bad arguments, found before any training)."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv=None):
  """Run the comparison; returns 0, 1 (determinism check failed) or 2 (bad arguments)."""
  args, overrides = parse_args(argv)
  start = time.time()
  try:
    config = load_config(args.config, overrides)
    set_a = parse_setting('--a', args.a)
    set_b = set_a if args.b is None else parse_setting('--b', args.b)
    config_a, config_b = arm_config(config, set_a, '--a'), arm_config(config, set_b, '--b')
    numerics_setup.configure(config)  # process-wide flags (GPU determinism) before any backend use
    lock = prepare(config_a, config_b, args.devices)
    rows = train(lock, args.steps, args.every, args.probe, log=lambda s: print(s, file=sys.stderr))
  except ValueError as e:
    fail(str(e).splitlines()[0])
  device, same = jax.devices()[0], config_a.numerics.to_dict() == config_b.numerics.to_dict()
  bad = [f'{what} differ by {r[what]["max_abs"]:.3e} at step {r["step"]}' for r in rows
         for what in ('params', 'batch_stats', 'logits') if same and r[what]['max_abs'] != 0]
  info = {'config_spec': args.config, 'seed': config.seed, 'steps': args.steps, 'every': args.every,
          'devices': lock['devices'], 'probe': min(args.probe, len(lock['ctx'].dataset.test)),
          'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__,
          'seconds': round(time.time() - start, 1), 'identical_settings': same,
          'deterministic': (not bad) if same else None, 'config': config.to_dict()}
  label = lambda s: ','.join(f'{k.split(".", 1)[1]}={v}' for k, v in s.items()) or 'config as given'
  result = {'info': info, 'records': rows,
            'arms': {n: {'label': label(s), 'overrides': s, 'numerics': lock['arms'][n]['numerics']}
                     for n, s in (('a', set_a), ('b', set_b))}}
  os.makedirs(args.out, exist_ok=True)
  print(markdown(result))
  for name, text in (('md', markdown(result)), ('json', json.dumps(result, indent=1, default=str))):
    with open(os.path.join(args.out, f'divergence.{name}'), 'w', encoding='utf-8') as f:
      f.write(text)
  for path in figure(result, args.out):
    print(f'wrote {path}')
  if same:
    print('determinism check: ' + (f'FAILED: {"; ".join(bad[:3])}' if bad else
                                   'passed (exactly zero distance at every step)'))
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
