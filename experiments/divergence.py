"""Two numerics settings of one run trained in lockstep over seeds, with a control and a ceiling.

  python -m experiments.divergence --config=configs/digits.py:study --a numerics.profile=f32 \
      --b numerics.profile=tpu_default --seeds 0 1 2 3 4 --out runs/divergence

Writes divergence.{md,json,png,pdf} to --out (docs/numerics.md); without --b, a determinism check.
"""

import argparse
import contextlib
import sys
import textwrap
import time

import numpy as np

import experiments
from analysis import analyse as cli
from configs import common, validation
from numerics import formats
from runrecord import files

# JAX, the trainer (experiments/lockstep.py) and matplotlib load in main: --help answers without.

DEFAULT_CONTROL = 'numerics.profile=bf16_noise'
FORMAT_FIELDS = tuple(f'numerics.{kind}_format' for kind in formats.KINDS)
OUTPUTS = ['divergence.md', 'divergence.json', 'divergence.png', 'divergence.pdf']
GROUPS = ('stem', 'layer1', 'layer2', 'layer3', 'layer4', 'head')  # parameter groups, in order


def parse_args(argv):
  """(args, [(config field, value)] of the --config.<field>=<value> flags)."""
  p = cli.Parser(
    prog='python -m experiments.divergence',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--config', required=True, help='config file and presets: configs/digits.py:cpu')
  p.add_argument('--a', required=True, help='arm a: numerics.<field>=<value>[,...]')
  p.add_argument('--b', default=None, help='arm b (default: the same as --a, a determinism check)')
  p.add_argument('--control', default=DEFAULT_CONTROL, help='arm a plus these; none: no control')
  seeds = p.add_mutually_exclusive_group()
  seeds.add_argument('--seeds', type=int, nargs='+', help='seeds (default: config.seed)')
  seeds.add_argument('--num-seeds', type=int, help='N seeds from config.seed on')
  p.add_argument('--steps', type=int, default=None, help='training steps (default: all)')
  p.add_argument('--every', type=int, default=10, help='steps between rows')
  p.add_argument('--probe', type=int, default=256, help='test images in the fixed probe batch')
  p.add_argument('--devices', type=int, default=0, help='data-parallel devices (0: all)')
  p.add_argument('--out', default='runs/divergence', help='folder for the table, JSON and figure')
  args, rest = p.parse_known_args(argv)
  for flag in ('steps', 'every', 'probe', 'num_seeds'):
    if (value := getattr(args, flag)) is not None and value < 1:
      cli.fail(f'--{flag.replace("_", "-")}={value}: give a positive integer')
  if args.seeds and (min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds)):
    cli.fail(f'--seeds={" ".join(map(str, args.seeds))}: give distinct non-negative integers')
  for item in rest:
    if not item.startswith('--config.') or '=' not in item:
      cli.fail(f'unrecognized argument {item}: set config fields as --config.<field>=<value>')
  return args, [tuple(item[len('--config.') :].split('=', 1)) for item in rest]


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
    out[key] = value  # text: typed like the field by configs/common.py
  return out


def load_config(spec, overrides=()):
  """The config of `spec` with the --config.<field> overrides, not resolved (arms come first)."""
  config = common.load(spec)
  for key, value in overrides:
    try:
      common.apply_overrides(config, [(key, value)])
    except ValueError as e:
      raise ValueError(f'--config.{key}: {str(e).splitlines()[0]}') from None
  return config


def arm_config(config, overrides, flag, seed):
  """The resolved config of one arm and seed: `config` with the arm's numerics overrides."""
  try:
    arm = config.copy_and_resolve_references()
    return validation.resolve(common.apply_overrides(arm, [*overrides.items(), ('seed', seed)]))
  except ValueError as e:  # ConfigError: one line naming the field
    raise ValueError(f'{flag}: {str(e).splitlines()[0]}') from None


def settings(args):
  """{'a': overrides, 'b': ..., ['control': ...]}; a control's profile replaces arm a's formats."""
  out = {'a': parse_setting('--a', args.a)}
  out['b'] = out['a'] if args.b is None else parse_setting('--b', args.b)
  if args.control.strip().lower() != 'none':
    control = parse_setting('--control', args.control)
    named = 'numerics.profile' in control
    base = {k: v for k, v in out['a'].items() if not (named and k in FORMAT_FIELDS)}
    out['control'] = {**base, **control}
  return out


# --- the report: Markdown tables (what every number means) and the figure ---
KIND_TITLES = {'b': 'a vs b', 'control': 'a vs control', 'ceiling': 'a vs a, other seed'}
PROBE = (('logits', 'logits ‖ΔL‖/‖La‖'), ('probe_disagreement', 'churn'))


def cell(b, spec='.2e'):
  """'mean [min, max]' of a band (one seed: the value; no value: –)."""
  if b['mean'] is None:
    return '–'
  if b['n'] == 1:
    return format(b['mean'], spec)
  return f'{b["mean"]:{spec}} [{b["min"]:{spec}}, {b["max"]:{spec}}]'


def pct(x):
  return f'{100 * x:.2f}'


def interval(low, high):
  return '–' if low is None else f'{pct(low)}–{pct(high)}'


def curve_table(result, metrics, with_loss):
  """One row per recorded step: `metrics` of every pair kind (and each arm's loss)."""
  curves, losses = result['curves'], result['losses']
  rows = []
  for i, step in enumerate(result['steps']):
    row = {'step': str(step)}
    for name, title in metrics:
      for kind in curves:
        spec = '.3f' if 'disagree' in name else '.2e'
        row[f'{title} {KIND_TITLES[kind]}'] = cell(curves[kind][name][i], spec)
    for arm, series in losses.items() if with_loss else ():
      row[f'loss {arm}'] = cell(series[i], '.4f')
    rows.append(row)
  return rows


PAIRS = {
  'b': '- **a vs b**: the same seed (the same initial weights and batches), other numerics.',
  'control': '- **a vs control**: arm a plus {control}, the same seed: a matched perturbation.',
  'ceiling': '- **a vs a, other seed** (the ceiling): two unrelated models of arm a.',
}
EXPLAIN = """
Distances in float64, relative to arm a (x: the pair's other model); churn: the share of predicted
labels that differ; loss: each arm's mean training loss since the previous row. Each cell: the mean
over seeds [{band}]. How to read them: docs/numerics.md ("Experiments on the numerics").
"""
FINAL = 'Per seed (pair) with its {ci}; across seeds, the mean with its {across}.\n'


def markdown(result):
  """The report: setup, arms, what the numbers mean, the curves table and the final tables."""
  from analysis import report as tables

  arms, info, final, curves = result['arms'], result['info'], result['final'], result['curves']
  lines = [
    f'# Divergence: a = {arms["a"]["label"]} vs b = {arms["b"]["label"]}\n',
    f'{info["config_spec"]}, seeds {", ".join(map(str, info["seeds"]))}, {info["steps"]} of '
    f'{info["total_steps"]} training steps, {info["platform"]} ({info["device_kind"]}), '
    f'{info["devices"]} device(s); probe: the first {info["probe"]} test images; test set: '
    f'{final["test_count"]} images.\n',
  ]
  for name, arm in arms.items():
    e = arm['numerics']['effective']
    acc = {k: (100 * v if isinstance(v, float) else v) for k, v in final['accuracy'][name].items()}
    lines.append(
      f'- arm {name} ({arm["label"]}): conv {e["conv_format"]}, dense {e["dense_format"]}, '
      f'precision {e["matmul_precision_flag"]}, compute {e["compute_dtype"]}, BN '
      f'{e["batchnorm"]}; final test accuracy {cell(acc, ".2f")} %'
    )
  groups = [  # the last row's parameter distance per group, max |Δθ| and BN statistics
    {
      'pair': KIND_TITLES[kind],
      **{g: cell(c[f'params.{g}'][-1]) for g in GROUPS if c[f'params.{g}'][-1]['mean'] is not None},
      'max\\|Δθ\\|': cell(c['params.max_abs'][-1]),
      'BN stats ‖Δ‖/‖a‖': cell(c['batch_stats'][-1]),
    }
    for kind, c in curves.items()
  ]
  churn = [  # whole-test-set churn per pair kind: per seed, then across seeds
    {
      'pair': KIND_TITLES[kind],
      'pairs': str(len(d['pairs'])),
      'per seed % [95% Wilson]': '; '.join(
        f'{pct(p["rate"])} [{interval(p["ci_low"], p["ci_high"])}]' for p in d['pairs']
      ),
      'mean over seeds %': '–' if d['across']['mean'] is None else pct(d['across']['mean']),
      '95% t-Wilson CI over seeds %': interval(d['across']['t_low'], d['across']['t_high']),
      'seeds in the CI': str(d['across']['pairs']),
      'labels differing (all seeds)': f'{d["total"]["count"]} of {d["total"]["n"]}',
    }
    for kind, d in final['disagreement'].items()
  ]
  control = arms.get('control', {}).get('label')
  return '\n'.join(
    [
      *lines,
      '\nPairs:\n',
      *(PAIRS[kind].format(control=control) for kind in curves),
      EXPLAIN.format(band=info['band']),
      '## Parameter distance during training\n',
      tables.markdown(curve_table(result, [('params', '‖Δθ‖/‖θa‖')], True)),
      '## Probe logits during training\n',
      tables.markdown(curve_table(result, PROBE, False)),
      f'## Per group at step {result["steps"][-1]}\n',
      tables.markdown(groups),
      '## Churn on the whole test set (share of predicted labels that differ)\n',
      FINAL.format(ci=info['interval'], across=info['across_interval']),
      tables.markdown(churn),
    ]
  )


def panel(ax, x, lines, title, log=True, lw=1.4):
  """Per (label, bands, colour): mean over seeds and min–max band; zeros left out on log axes."""
  nonzero = any(b['max'] for _, bands, _ in lines for b in bands)
  if log and nonzero:
    ax.set_yscale('log')
  for label, bands, color in lines:
    mean, low, high = (
      np.array([np.nan if b[k] is None else b[k] for b in bands], float)
      for k in ('mean', 'min', 'max')
    )
    if log and nonzero:
      mean, low, high = (np.where(v > 0, v, np.nan) for v in (mean, low, high))
    ax.plot(x, mean, marker='.', ms=3, color=color, lw=lw, label=label)
    ax.fill_between(x, low, high, color=color, alpha=0.18, lw=0)
  if not nonzero:
    ax.text(0.5, 0.85, 'exactly 0 at every step', ha='center', transform=ax.transAxes)
  ax.set(title=title, xlabel='step', xlim=(0, max(x[-1], 1)))


def figure(result, out_dir):
  """Distances vs step per pair kind, a vs b per group, losses, the final churn; PNG + PDF."""
  import matplotlib.pyplot as plt

  from analysis import figures as style

  style.apply()
  colors = {'b': style.PALETTE[1], 'control': style.PALETTE[2], 'ceiling': style.PALETTE[6]}
  info, x, curves = result['info'], result['steps'], result['curves']
  fig, axes = plt.subplots(3, 3, figsize=(style.WIDTH_IN, 6.0), constrained_layout=True)
  axes = axes.ravel()
  panels = [
    ('params', 'params ‖θa−θx‖/‖θa‖'),
    ('params.max_abs', 'params max |θa−θx|'),
    ('batch_stats', 'BN statistics ‖Δ‖/‖a‖'),
    ('logits', 'probe logits ‖ΔL‖/‖La‖'),
    ('probe_disagreement', 'probe: churn (share of labels)'),
  ]
  for ax, (name, title) in zip(axes, panels, strict=False):  # the first five of nine
    lines = [(KIND_TITLES[kind], c[name], colors[kind]) for kind, c in curves.items()]
    panel(ax, x, lines, title, log=name != 'probe_disagreement')
  axes[0].legend(loc='lower right', fontsize=6)
  groups = [g for g in GROUPS if curves['b'][f'params.{g}'][-1]['mean'] is not None]
  lines = [(g, curves['b'][f'params.{g}'], c) for g, c in zip(groups, style.PALETTE, strict=False)]
  panel(axes[5], x, lines, 'a vs b per group ‖Δθ‖/‖θa‖', lw=0.9)
  axes[5].legend(ncol=2, fontsize=6, handlelength=1)
  arm_colors = style.arm_colors(result['losses'])
  lines = [
    (f'{arm}: {result["arms"][arm]["label"]}', series, arm_colors[arm])
    for arm, series in result['losses'].items()
  ]
  panel(axes[6], x, lines, 'train loss since last row', log=False)
  axes[6].legend(fontsize=6)
  ax, kinds = axes[7], list(result['final']['disagreement'])  # churn: mean over seeds, per seed
  for i, (kind, d) in enumerate(result['final']['disagreement'].items()):
    a, color = d['across'], colors[kind]
    if a['t_low'] is not None:
      ax.plot([i, i], [100 * a['t_low'], 100 * a['t_high']], color=color, lw=1.4)
    ax.plot([i], [100 * a['mean']], 'o', color=color)
    for j, q in enumerate(d['pairs']):
      at = i + 0.12 + 0.05 * j
      ax.plot([at, at], [100 * q['ci_low'], 100 * q['ci_high']], color=color, lw=0.5, alpha=0.6)
      ax.plot([at], [100 * q['rate']], '.', color=color, ms=3, alpha=0.7)
  ax.set_xticks(range(len(kinds)), [textwrap.fill(KIND_TITLES[k], 10) for k in kinds], fontsize=6)
  ax.set(title='end: churn, % of test labels', xlim=(-0.5, len(kinds) - 0.5), ylim=(0, None))
  axes[8].axis('off')
  legend = (
    f'lines: mean over seeds; bands: {info["band"]}; final: churn (share of predicted labels that '
    f'differ), mean over seeds, {info["across_interval"]}; dots: each seed, {info["interval"]}'
  )
  axes[8].text(0, 0.5, textwrap.fill(legend, 34), fontsize=6.5, va='center')
  return style.save(fig, out_dir, 'divergence')


def main(argv=None):
  """0, or 1 (determinism check failed; an output not written); bad input: exit 2."""
  args, overrides = parse_args(argv)
  import jax

  from experiments import lockstep
  from numerics import setup as numerics_setup

  start = time.time()
  progress = lockstep.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  progress.say(f'loading {args.config}')
  with contextlib.ExitStack() as stack:
    try:  # bad input, found before any training
      config = load_config(args.config, overrides)
      arms = settings(args)
      seeds = args.seeds or list(range(config.seed, config.seed + (args.num_seeds or 1)))
      configs = {
        seed: {n: arm_config(config, s, f'--{n}', seed) for n, s in arms.items()} for seed in seeds
      }
      dest = stack.enter_context(
        files.Destination(args.out, command='divergence', may_write=OUTPUTS)
      )
      numerics_setup.configure(configs[seeds[0]]['a'])  # process-wide flags, before any backend
      lock = lockstep.prepare(configs, args.devices, progress)
      total = lock['ctx'].total_steps
      if args.steps is not None and not 1 <= args.steps <= total:
        raise ValueError(
          f'--steps={args.steps}: give 1..{total} (the config trains {total} steps; more need a '
          'larger --config.num_epochs)'
        )
      num_steps = args.steps or total
    except ValueError as e:
      cli.fail(str(e).splitlines()[0])
    rows = lockstep.train(lock, num_steps, args.every, args.probe, progress)
    progress.say('predicting the whole test set with every arm')
    final = lockstep.final_test(lock)
    curves = {  # {pair kind: {curve: [band per row]}}, {arm: [band of its loss per row]}
      kind: {
        name: [lockstep.band(map(get, r['pairs'][kind])) for r in rows]
        for name, get in lockstep.CURVES.items()
      }
      for kind in rows[0]['pairs']
    }
    losses = {arm: [lockstep.band(r['loss'][arm]) for r in rows] for arm in rows[0]['loss']}
    device = jax.devices()[0]
    first = configs[seeds[0]]
    same = first['a'].numerics.to_dict() == first['b'].numerics.to_dict()
    info = {
      'config_spec': args.config,
      'seeds': seeds,
      'steps': num_steps,
      'total_steps': total,
      'every': args.every,
      'devices': lock['devices'],
      'probe': min(args.probe, len(lock['ctx'].dataset.test)),
      'platform': device.platform,
      'device_kind': device.device_kind,
      'jax': jax.__version__,
      'identical_settings': same,
      'band': lockstep.BAND_NAME,
      'interval': lockstep.CI_NAME,
      'across_interval': lockstep.ACROSS_NAME,
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
        n: {'label': ','.join(f'{k[9:]}={v}' for k, v in s.items()) or 'config as given'}
        | {'overrides': s, 'numerics': lock['numerics'][n]}
        for n, s in arms.items()
      },
    }
    bad = [
      f'seed {p["seeds"][0]}: {what} differ by {p[what]["max_abs"]:.3e} at step {r["step"]}'
      for r in rows
      for p in r['pairs']['b']
      for what in ('params', 'batch_stats', 'logits')
      if same and p[what]['max_abs'] != 0
    ]
    if same and (count := final['disagreement']['b']['total']['count']):
      bad.append(f'{count} predicted test labels differ at the end')
    info['deterministic'] = (not bad) if same else None
    info['seconds'] = round(time.time() - start, 1)
    print(markdown(result))
    if experiments.write_report(dest, result, 'divergence', markdown, figure):
      return 1
  if same:
    failed = 'FAILED: ' + '; '.join(bad[:3])
    print(f'determinism check: {failed if bad else "passed (exactly zero distance at every step)"}')
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
