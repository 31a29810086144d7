"""What the divergence tool writes: Markdown tables (what every number means) and the figure (PNG +
PDF).
Reference: docs/numerics.md "Experiments on the numerics".
"""

import textwrap

import numpy as np

from analysis.figures import style
from analysis.words import tables
from experiments import divergence_measure as measure

KIND_TITLES = {'b': 'a vs b', 'control': 'a vs control', 'ceiling': 'a vs a, other seed'}
KIND_TICKS = {'b': 'a vs b', 'control': 'a vs\ncontrol', 'ceiling': 'a vs a,\nother seed'}
# The colour of the pair's other model: arms a, b, control as style.arm_colors gives them.
KIND_COLORS = {'b': style.PALETTE[1], 'control': style.PALETTE[2], 'ceiling': style.PALETTE[6]}
PARAMS = (('params', '‖Δθ‖/‖θa‖'),)
PROBE = (('logits', 'logits ‖ΔL‖/‖La‖'), ('probe_disagreement', 'churn'))


def cell(b, spec='.2e'):
  """'mean [min, max]' (one seed: the value; no value: –)."""
  if b['mean'] is None:
    return '–'
  if b['n'] == 1:
    return format(b['mean'], spec)
  return f'{b["mean"]:{spec}} [{b["min"]:{spec}}, {b["max"]:{spec}}]'


def pct(x):
  return f'{100 * x:.2f}'


def percent(b):
  """A band of fractions in percent."""
  return {k: (100 * v if isinstance(v, float) else v) for k, v in b.items()}


def curve_table(result, metrics, with_loss):
  """One row per recorded step: `metrics` of every pair kind (and each arm's loss)."""
  curves, losses, steps = result['curves'], result['losses'], result['steps']
  rows = []
  for i, step in enumerate(steps):
    row = {'step': str(step)}
    for name, title in metrics:
      for kind in curves:
        row[f'{title} {KIND_TITLES[kind]}'] = cell(
          curves[kind][name][i], '.3f' if 'disagree' in name else '.2e'
        )
    for arm, series in losses.items() if with_loss else ():
      row[f'loss {arm}'] = cell(series[i], '.4f')
    rows.append(row)
  return rows


def group_table(result):
  """The last row's parameter distance per group (and max |Δθ|, BN statistics) per pair kind."""
  rows = []
  for kind, c in result['curves'].items():
    row = {'pair': KIND_TITLES[kind]}
    row.update(
      {
        g: cell(c[f'params.{g}'][-1])
        for g in measure.GROUPS
        if c[f'params.{g}'][-1]['mean'] is not None
      }
    )
    row.update(
      {'max\\|Δθ\\|': cell(c['params.max_abs'][-1]), 'BN stats ‖Δ‖/‖a‖': cell(c['batch_stats'][-1])}
    )
    rows.append(row)
  return rows


def interval(low, high):
  return '–' if low is None else f'{pct(low)}–{pct(high)}'


def final_table(result):
  """Whole-test-set churn (the share of predicted labels that differ) per pair kind: per seed
  (Wilson over images; multilabel: t-Wilson over images), then across seeds (t-Wilson)."""
  rows = []
  for kind, d in result['final']['disagreement'].items():
    across, total = d['across'], d['total']
    rows.append(
      {
        'pair': KIND_TITLES[kind],
        'pairs': str(len(d['pairs'])),
        'per seed % [95% Wilson]': '; '.join(
          f'{pct(p["rate"])} [{interval(p["ci_low"], p["ci_high"])}]' for p in d['pairs']
        ),
        'mean over seeds %': '–' if across['mean'] is None else pct(across['mean']),
        '95% t-Wilson CI over seeds %': interval(across['t_low'], across['t_high']),
        'seeds in the CI': str(across['pairs']),
        'labels differing (all seeds)': f'{total["count"]} of {total["n"]}',
      }
    )
  return rows


def header(result):
  arms, info, final = result['arms'], result['info'], result['final']
  seeds = ', '.join(str(s) for s in info['seeds'])
  lines = [
    f'# Divergence: a = {arms["a"]["label"]} vs b = {arms["b"]["label"]}\n',
    f'{info["config_spec"]}, seeds {seeds}, {info["steps"]} of {info["total_steps"]} '
    f'training steps, {info["platform"]} ({info["device_kind"]}), {info["devices"]} '
    f'device(s); probe: the first {info["probe"]} test images; test set: '
    f'{final["test_count"]} images.\n',
  ]
  for name, arm in arms.items():
    e = arm['numerics']['effective']
    acc = final['accuracy'][name]
    lines.append(
      f'- arm {name} ({arm["label"]}): conv {e["conv_format"]}, dense '
      f'{e["dense_format"]}, precision {e["matmul_precision_flag"]}, compute '
      f'{e["compute_dtype"]}, BN {e["batchnorm"]}; final test accuracy '
      f'{cell(percent(acc), ".2f")} %'
    )
  return lines


PAIRS = {
  'b': """- **a vs b**: the same seed (bit-identical initial weights, the same batches); only the
  numerics differ.""",
  'control': """- **a vs control**: arm a plus {control}, the same seed. The default control,
  profile=bf16_noise, moves every product operand by unbiased noise of the size of bf16 rounding:
  a perturbation of matched magnitude with no systematic direction. Where a vs b is no larger, b's
  format acts like any perturbation of that size amplified by training; where it is clearly larger
  (beyond the bands), the format does more than a random perturbation of its size would.""",
  'ceiling': """- **a vs a, other seed** (the ceiling): arm a with seed s against arm a with the
  next seed of the list (other initial weights and data order): how far apart two unrelated models
  of one arm are. On a deterministic platform a repeated seed gives exactly the same model, so an
  arm's replicates are its runs with different seeds.""",
}

EXPLAIN = """
Distances (float64, relative to arm a; x is the pair's other model): ‖θa−θx‖/‖θa‖ over all
parameters and per group, max |Δθ| in parameter units, the BatchNorm running statistics' relative
L2, and on the probe the eval-mode logits' ‖La−Lx‖/‖La‖ and the churn, the share of the probe's
predicted labels that differ (images; multilabel: image × attribute labels, the definition of the
analysis's churn, analysis/numbers/agreement.py). Loss: each arm's mean training loss
since the previous row. Every cell: the mean over the seeds (pairs) [{band}]; the JSON also has
the sd and the 95% t-interval of the mean.
"""

FINAL = """Whole test set at the end of training: the churn, the share of predicted labels that
differ (images; multilabel: image × attribute labels), per seed (pair) with its {ci}
(statsmodels proportion_confint; several labels per image are not independent, so their interval is
over the images), then across seeds: the mean of the per-seed shares with its {across} (seeds are
the units; the ceiling pairs of consecutive seeds share seeds, so only pairs without a shared seed
enter it). Pooling all seeds' images into one binomial sample would ignore the variation between
seeds and give too narrow an interval.
"""


def markdown(result):
  """The report: setup, arms, what the numbers mean, the curves table and the final tables."""
  control = result['arms'].get('control', {}).get('label')
  pairs = [PAIRS[kind].format(control=control) for kind in result['curves']]
  return '\n'.join(
    [
      *header(result),
      '\nPairs:\n',
      *pairs,
      EXPLAIN.format(band=measure.BAND_NAME),
      '## Parameter distance during training\n',
      tables.markdown(curve_table(result, PARAMS, True)),
      '## Probe logits during training\n',
      tables.markdown(curve_table(result, PROBE, False)),
      f'## Per group at step {result["steps"][-1]}\n',
      tables.markdown(group_table(result)),
      '## Churn on the whole test set (share of predicted labels that differ)\n',
      FINAL.format(ci=measure.CI_NAME, across=measure.ACROSS_NAME),
      tables.markdown(final_table(result)),
    ]
  )


def plot_band(ax, x, series, color, label, lw=1.4):
  """Mean line and min–max band; zeros left out on log axes."""

  def get(key):
    return np.array([np.nan if b[key] is None else b[key] for b in series], float)

  mean, low, high = get('mean'), get('min'), get('max')
  if ax.get_yscale() == 'log':
    mean, low, high = (np.where(v > 0, v, np.nan) for v in (mean, low, high))
  ax.plot(x, mean, marker='.', ms=3, color=color, lw=lw, label=label)
  ax.fill_between(x, low, high, color=color, alpha=0.18, lw=0)


def distance_panel(ax, x, curves, name, title, log=True):
  has = [np.any(np.array([b['max'] or 0 for b in c[name]]) > 0) for c in curves.values()]
  if log and any(has):
    ax.set_yscale('log')
  for kind, c in curves.items():
    plot_band(ax, x, c[name], KIND_COLORS[kind], KIND_TITLES[kind])
  if not any(has):
    ax.text(0.5, 0.85, 'exactly 0 at every step', ha='center', transform=ax.transAxes)
  ax.set(title=title, xlabel='step', xlim=(0, max(x[-1], 1)))


def final_panel(ax, final):
  """Whole-test-set churn per pair kind: the mean over seeds with its t-Wilson interval over
  seeds, and each pair's rate with its own interval beside it; every bound inside 0–100 %."""
  kinds = list(final['disagreement'])
  for i, kind in enumerate(kinds):
    d = final['disagreement'][kind]
    a = d['across']
    if a['t_low'] is not None:
      ax.plot([i, i], [100 * a['t_low'], 100 * a['t_high']], color=KIND_COLORS[kind], lw=1.4)
    ax.plot([i], [100 * a['mean']], 'o', color=KIND_COLORS[kind])
    for j, q in enumerate(d['pairs']):
      x = i + 0.12 + 0.05 * j
      ax.plot(
        [x, x], [100 * q['ci_low'], 100 * q['ci_high']], color=KIND_COLORS[kind], lw=0.5, alpha=0.6
      )
      ax.plot([x], [100 * q['rate']], '.', color=KIND_COLORS[kind], ms=3, alpha=0.7)
  ax.set_xticks(range(len(kinds)), [KIND_TICKS[k] for k in kinds], fontsize=6)
  ax.set(title='end: churn, % of test labels', xlim=(-0.5, len(kinds) - 0.5), ylim=(0, None))


def figure(result, out_dir):
  """Distances vs step (mean over seeds, min–max band) per pair kind, a vs b per group, losses,
  and the final whole-test-set disagreement; PNG + PDF."""
  style.apply()
  import matplotlib.pyplot as plt  # only where a figure is drawn

  x, curves = result['steps'], result['curves']
  fig, axes = plt.subplots(3, 3, figsize=(style.WIDTH_IN, 6.0), constrained_layout=True)
  axes = axes.ravel()
  for ax, (name, title, log) in zip(
    axes,
    [
      ('params', 'params ‖θa−θx‖/‖θa‖', True),
      ('params.max_abs', 'params max |θa−θx|', True),
      ('batch_stats', 'BN statistics ‖Δ‖/‖a‖', True),
      ('logits', 'probe logits ‖ΔL‖/‖La‖', True),
      ('probe_disagreement', 'probe: churn (share of labels)', False),
    ],
    strict=False,  # the first five of the nine panels
  ):
    distance_panel(ax, x, curves, name, title, log)
  axes[0].legend(loc='lower right', fontsize=6)
  groups = {
    g: curves['b'][f'params.{g}']
    for g in measure.GROUPS
    if curves['b'][f'params.{g}'][-1]['mean'] is not None
  }
  if any(b['max'] for s in groups.values() for b in s):
    axes[5].set_yscale('log')
  # strict=False: the palette has more colours than there are groups
  for color, (g, series) in zip(style.PALETTE, groups.items(), strict=False):
    plot_band(axes[5], x, series, color, g, lw=0.9)
  axes[5].set(title='a vs b per group ‖Δθ‖/‖θa‖', xlabel='step', xlim=(0, max(x[-1], 1)))
  axes[5].legend(ncol=2, fontsize=6, handlelength=1)
  arm_colors = style.arm_colors(result['losses'])
  for arm, series in result['losses'].items():
    plot_band(axes[6], x, series, arm_colors[arm], f'{arm}: {result["arms"][arm]["label"]}')
  axes[6].set(title='train loss since last row', xlabel='step', xlim=(0, max(x[-1], 1)))
  axes[6].legend(fontsize=6)
  final_panel(axes[7], result['final'])
  axes[8].axis('off')
  legend = (
    f'lines: mean over seeds; bands: {measure.BAND_NAME}; final: churn (share of predicted '
    f'labels that differ), mean over seeds, {measure.ACROSS_NAME}; dots: each seed, '
    f'{measure.CI_NAME}'
  )
  axes[8].text(0, 0.5, textwrap.fill(legend, 34), fontsize=6.5, va='center')
  return style.save(fig, out_dir, 'divergence')
