"""Two numerics settings of one run trained in lockstep over seeds, with a control and a ceiling.

How far apart do the models drift, against a perturbation of matched magnitude (the control) and
the distance between unrelated models of one arm (the ceiling: another seed)?

  python -m experiments.divergence --config=configs/digits.py:study --a numerics.profile=f32 \
      --b numerics.profile=tpu_default --seeds 0 1 2 3 4 --out runs/divergence

`--a`/`--b`/`--control`: `numerics.<field>=<value>[,...]` (prefix optional). No `--b`: b = a, a
determinism check (exactly zero distance at every step and no test image predicted differently, else
exit code 1). `--control` (default `numerics.profile=bf16_noise`, `none` for no control arm): arm a
plus these overrides, a perturbation of matched magnitude; a control that names a profile replaces
arm a's product formats (its conv_format / dense_format) unless it names them too. `--seeds S ...`
or `--num-seeds N` (config.seed, config.seed+1, ...): the lockstep comparison per seed; from two
seeds on, arm a of consecutive seeds is the ceiling pair. `--config.<field>=<v>`: every arm.
`--steps` (default: the whole training), a row every `--every` steps: distances per pair
(divergence_measure.py), the mean over seeds with the min–max band; at the end, the churn (the share
of predicted labels that differ: images, or image × attribute labels; the analysis's definition) on
the whole test set per seed (Wilson intervals; multilabel: over images), then across seeds (t-Wilson
interval over seeds, inside 0–100 %). Writes divergence.{json,md,png,pdf} to --out.
Reference: docs/numerics.md "Experiments on the numerics".
"""

import argparse
import json
import os
import sys
import time

DEFAULT_CONTROL = 'numerics.profile=bf16_noise'


def fail(message):
  """A one-line error on stderr, exit code 2 (bad arguments, found before any training)."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m experiments.divergence', description=' '.join(__doc__.split('\n\n')[0].split())
  )
  p.add_argument('--config', required=True, help='config file and presets: configs/digits.py:cpu')
  p.add_argument('--a', required=True, help='arm a: numerics.<field>=<value>[,...]')
  p.add_argument('--b', default=None, help='arm b (default: the same as --a, a determinism check)')
  p.add_argument(
    '--control',
    default=DEFAULT_CONTROL,
    help='the control arm: arm a plus these numerics overrides; none: no control',
  )
  seeds = p.add_mutually_exclusive_group()
  seeds.add_argument('--seeds', type=int, nargs='+', help='seeds (default: config.seed)')
  seeds.add_argument('--num-seeds', type=int, help='N seeds from config.seed on')
  p.add_argument(
    '--steps',
    type=int,
    default=None,
    help='training steps of every arm (default: all, to the end of training)',
  )
  p.add_argument('--every', type=int, default=10, help='steps between rows')
  p.add_argument('--probe', type=int, default=256, help='test images in the fixed probe batch')
  p.add_argument('--devices', type=int, default=0, help='data-parallel devices (0: all)')
  p.add_argument('--out', default='runs/divergence', help='folder for the table, JSON and figure')
  p.error = fail  # one line, not argparse's usage block
  args, rest = p.parse_known_args(argv)
  for flag in ('steps', 'every', 'probe', 'num_seeds'):
    value = getattr(args, flag)
    if value is not None and value < 1:
      fail(f'--{flag.replace("_", "-")}={value}: give a positive integer')
  if args.seeds and (min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds)):
    fail(f'--seeds={" ".join(map(str, args.seeds))}: give distinct non-negative integers')
  for item in rest:
    if not item.startswith('--config.') or '=' not in item:
      fail(f'unrecognized argument {item}: set config fields as --config.<field>=<value>')
  return args, [tuple(item[len('--config.') :].split('=', 1)) for item in rest]


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  parse_args(sys.argv[1:])

import jax

from configs import common, loader
from experiments import divergence_lockstep as lockstep
from experiments import divergence_measure as measure
from experiments import divergence_output as output
from numerics import profiles
from numerics import setup as numerics_setup
from trainer import run

FORMAT_FIELDS = tuple(f'numerics.{kind}_format' for kind in profiles.KINDS)


def parse_setting(flag, text):
  """'numerics.profile=f32,compute_dtype=bfloat16' -> {'numerics.profile': 'f32', ...}."""
  out = {}
  for item in filter(None, (s.strip() for s in (text or '').split(','))):
    key, eq, value = (s.strip() for s in item.partition('='))
    if not eq or not key or not value:
      raise ValueError(
        f'{flag}={text}: give numerics.<field>=<value> pairs, e.g. '
        f'{flag} numerics.profile=tpu_default'
      )
    key = key if '.' in key else f'numerics.{key}'
    if not key.startswith('numerics.') or key.count('.') != 1:
      raise ValueError(
        f'{flag}: {key} is not a numerics field; arms differ only in numerics.*, '
        f'set other fields for both with --config.{key}=...'
      )
    if key in ('numerics.gpu_deterministic', 'numerics.xla_flags'):  # XLA flags of the process
      raise ValueError(f'{flag}: {key} is process-wide; set it for both with --config.{key}=...')
    out[key] = value  # text: typed like the field by configs/loader.py
  return out


def load_config(spec, overrides=()):
  """`configs/x.py:preset,...` plus `--config.<field>=<value>` overrides (configs/loader.py), not
  resolved: the arms' overrides come first."""
  config = loader.load(spec)
  for key, value in overrides:
    try:
      common.apply_overrides(config, [(key, value)])
    except ValueError as e:
      raise ValueError(f'--config.{key}: {str(e).splitlines()[0]}') from None
  return config


def arm_config(config, overrides, flag, seed):
  """The resolved config of one arm and seed: `config` with the arm's numerics overrides."""
  try:
    arm = common.apply_overrides(
      config.copy_and_resolve_references(), [*overrides.items(), ('seed', seed)]
    )
    return run.validation.resolve(arm)
  except ValueError as e:  # ConfigError is a ValueError: one line naming the field
    raise ValueError(f'{flag}: {str(e).splitlines()[0]}') from None


def settings(args):
  """{'a': overrides, 'b': ..., ['control': ...]} from the flags."""
  out = {'a': parse_setting('--a', args.a)}
  out['b'] = out['a'] if args.b is None else parse_setting('--b', args.b)
  if args.control.strip().lower() != 'none':
    control = parse_setting('--control', args.control)
    named = 'numerics.profile' in control  # a profile replaces arm a's own formats
    base = {k: v for k, v in out['a'].items() if not (named and k in FORMAT_FIELDS)}
    out['control'] = {**base, **control}
  return out


def label(setting):
  return ','.join(f'{k.split(".", 1)[1]}={v}' for k, v in setting.items()) or 'config as given'


def determinism_failures(result):
  """With identical settings for a and b: every nonzero a-vs-b difference (empty: deterministic)."""
  bad = [
    f'seed {p["seeds"][0]}: {what} differ by {p[what]["max_abs"]:.3e} at step {r["step"]}'
    for r in result['records']
    for p in r['pairs']['b']
    for what in ('params', 'batch_stats', 'logits')
    if p[what]['max_abs'] != 0
  ]
  count = result['final']['disagreement']['b']['total']['count']
  return bad + ([f'{count} predicted test labels differ at the end'] if count else [])


def write(result, out_dir):
  """divergence.md/.json/.png/.pdf; prints the report and the figure's paths."""
  os.makedirs(out_dir, exist_ok=True)
  text = output.markdown(result)
  print(text)
  for name, content in (('md', text), ('json', json.dumps(result, indent=1, default=str))):
    with open(os.path.join(out_dir, f'divergence.{name}'), 'w', encoding='utf-8') as f:
      f.write(content)
  for path in output.figure(result, out_dir):
    print(f'wrote {path}')


def main(argv=None):
  """Run the comparison; returns 0, 1 (determinism check failed) or 2 (bad arguments)."""
  args, overrides = parse_args(argv)
  start = time.time()
  progress = lockstep.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  progress.say(f'loading {args.config}')
  try:
    config = load_config(args.config, overrides)
    arms = settings(args)
    seeds = args.seeds or list(range(config.seed, config.seed + (args.num_seeds or 1)))
    configs = {
      seed: {n: arm_config(config, s, f'--{n}', seed) for n, s in arms.items()} for seed in seeds
    }
    # process-wide flags (GPU determinism; the same for every arm) before any backend use
    numerics_setup.configure(configs[seeds[0]]['a'])
    lock = lockstep.prepare(configs, args.devices, progress)
    num_steps = args.steps or lock['ctx'].total_steps
    rows = lockstep.train(lock, num_steps, args.every, args.probe, progress)
  except ValueError as e:
    fail(str(e).splitlines()[0])
  progress.say('predicting the whole test set with every arm')
  final = lockstep.final_test(lock)
  curves, losses = measure.curves(rows)
  device = jax.devices()[0]
  first = configs[seeds[0]]
  same = first['a'].numerics.to_dict() == first['b'].numerics.to_dict()
  info = {
    'config_spec': args.config,
    'seeds': seeds,
    'steps': num_steps,
    'total_steps': lock['ctx'].total_steps,
    'every': args.every,
    'devices': lock['devices'],
    'probe': min(args.probe, len(lock['ctx'].dataset.test)),
    'platform': device.platform,
    'device_kind': device.device_kind,
    'jax': jax.__version__,
    'identical_settings': same,
    'band': measure.BAND_NAME,
    'interval': measure.CI_NAME,
    'across_interval': measure.ACROSS_NAME,
    'config': config.to_dict(),
  }
  result = {
    'info': info,
    'steps': [r['step'] for r in rows],
    'curves': curves,
    'losses': losses,
    'final': final,
    'records': rows,
    'arms': {
      n: {'label': label(s), 'overrides': s, 'numerics': lock['numerics'][n]}
      for n, s in arms.items()
    },
  }
  bad = determinism_failures(result) if same else []
  info['deterministic'] = (not bad) if same else None
  info['seconds'] = round(time.time() - start, 1)
  write(result, args.out)
  if same:
    print(
      'determinism check: '
      + (f'FAILED: {"; ".join(bad[:3])}' if bad else 'passed (exactly zero distance at every step)')
    )
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
