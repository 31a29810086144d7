"""Publication figures of a study, as PDF and 300-dpi PNG, in analysis/style.py's style.

  python -m analysis.figures --runs=/tmp/study --out=/tmp/study/figures [--group-by ...] [--margin 0.5]

Writes, for the runs that analysis.stats keeps (completed; replicates of a seed averaged):
  accuracy_by_arm   the final metric per arm: every seed (points), mean ± 95% CI (the arm table's
                    interval); quartile boxes only from BOX_MIN_N seeds per arm
  paired_diffs      every pair's Δ = A − B ± 90% CI (filled: paired on seeds, hollow: Welch), the
                    per-seed differences of paired pairs, the ±margin band, the verdict
  training_curves   training loss per logged step (each run's metrics.jsonl) and the test metric
                    per epoch, y zoomed to the last epochs: mean per arm, band = ± 1 sd over runs
Legends list only what is drawn. The y axes span the data, not 0–100%.
"""

import argparse
import sys

import numpy as np
from matplotlib import ticker

from analysis import stats, style

plt = style.plt
BOX_MIN_N = 10  # below this many seeds per arm a box (quartiles) says less than the points


def jitter(n, width=0.12, seed=0):
  """Fixed horizontal offsets for n points (the same figure every time)."""
  return np.random.default_rng(seed).uniform(-width, width, n)


def wrap(label, width=16):
  """One line per part of an arm label; a long 'key=value' part breaks after its '='."""
  lines = []
  for part in label.split(', '):
    key, eq, value = part.partition('=')
    lines += [key + eq, value] if eq and len(part) > width else [part]
  return '\n'.join(lines)


def legend_above(ax, ncol=3):
  """The legend in one row above the axes, outside the data; none when nothing has a label."""
  if ax.get_legend_handles_labels()[1]:
    ax.legend(loc='lower left', bbox_to_anchor=(0.0, 1.01), ncol=ncol, handletextpad=0.3,
              columnspacing=1.2, borderaxespad=0.0)


def unit_label(out):
  """Axis label of the metric, e.g. 'test accuracy (%)'."""
  name = out['metric'].rsplit('.', 1)[-1].replace('_', ' ')
  return f'{name} (%)' if out['scale'] == 100 else name


def once(label, seen):
  """`label` the first time it is asked for, None after (one legend entry per kind)."""
  if label in seen:
    return None
  seen.add(label)
  return label


def draw_box(ax, i, x, color, seen):
  ax.boxplot([x], positions=[i], widths=0.5, showfliers=False, patch_artist=True,
             boxprops={'facecolor': color, 'alpha': 0.18, 'edgecolor': color},
             medianprops={'color': color, 'linewidth': 1.0}, whiskerprops={'color': color},
             capprops={'color': color}, label=once(f'quartiles (n ≥ {BOX_MIN_N})', seen))


def draw_accuracy_by_arm(out):
  """The figure: points per seed, mean ± 95% CI (black), boxes only from BOX_MIN_N seeds."""
  arms, units = out['arms'], out['units']
  colors, seen = style.arm_colors(arms['arm']), set()
  fig, ax = plt.subplots(figsize=(max(3.4, 1.3 * len(arms) + 0.8), 2.8))
  for i, row in enumerate(arms.itertuples()):
    x = units.loc[units['arm'] == row.arm, 'value'].to_numpy()
    if len(x) >= BOX_MIN_N:
      draw_box(ax, i, x, colors[row.arm], seen)
    ax.scatter(i - 0.05 + jitter(len(x), seed=i), x, s=11, color=colors[row.arm], alpha=0.85,
               linewidths=0, zorder=3,
               label=once('one seed' if out['seeded'] else 'one run', seen))
    if np.isfinite(row.ci_low):
      ax.errorbar(i + 0.32, row.mean, yerr=[[row.mean - row.ci_low], [row.ci_high - row.mean]],
                  fmt='D', color='black', markersize=3.5, capsize=2.5, linewidth=0.9, zorder=4,
                  label=once(f'mean ± 95% CI ({row.ci_method})', seen))
    else:
      ax.plot(i + 0.32, row.mean, 'D', color='black', markersize=3.5, zorder=4,
              label=once('mean (n < 2: no CI)', seen))
  ax.set_xticks(range(len(arms)), [f'{wrap(a)}\n(n = {n})' for a, n in zip(arms['arm'], arms['n'])])
  ax.set_xlim(-0.6, len(arms) - 0.3)
  ax.set_ylabel(unit_label(out))
  legend_above(ax)
  return fig


def accuracy_by_arm(out, out_dir):
  return style.save(draw_accuracy_by_arm(out), out_dir, 'accuracy_by_arm')


def seed_differences(out, p):
  """Per-seed A − B on the pair's shared seeds (replicates averaged)."""
  units = out['units']
  a = units[units['arm'] == p['arm_a']].set_index('seed')['value']
  b = units[units['arm'] == p['arm_b']].set_index('seed')['value']
  shared = sorted(set(a.index) & set(b.index), key=stats.seed_key)
  return (a.loc[shared] - b.loc[shared]).to_numpy()


def draw_paired_diffs(out):
  """The figure: Δ ± 90% CI per pair against the ±margin band; per-seed points when paired."""
  unit, margin, seen = ('pp' if out['scale'] == 100 else 'units'), out['margin'], set()
  pairs = out['pairs']
  fig, ax = plt.subplots(figsize=(max(3.4, 1.5 * len(pairs) + 0.8), 2.8))
  ax.axhspan(-margin, margin, color='#009E73', alpha=0.12, linewidth=0,
             label=f'equivalence margin ±{margin:g} {unit}')
  ax.axhline(0, color='#555555', linewidth=0.6)
  for i, p in enumerate(pairs.itertuples()):
    if p.paired:
      d = seed_differences(out, p._asdict())
      ax.scatter(i - 0.08 + jitter(len(d), seed=i), d, s=11, color='#0072B2', alpha=0.85,
                 linewidths=0, zorder=3, label=once('one seed: A − B', seen))
    kind = 'paired' if p.paired else 'Welch, unpaired'
    ax.errorbar(i + 0.25, p.diff, yerr=[[p.diff - p.ci90_low], [p.ci90_high - p.diff]], fmt='D',
                color='black', markersize=3.5, capsize=2.5, linewidth=0.9, zorder=4,
                markerfacecolor='black' if p.paired else 'white',
                label=once(f'Δ ± 90% CI ({kind})', seen))
  ax.set_xticks(range(len(pairs)), [f'{wrap(p.arm_a)}\n−\n{wrap(p.arm_b)}\n[{p.verdict}]'
                                    for p in pairs.itertuples()])
  ax.set_xlim(-0.6, len(pairs) - 0.4)
  ax.set_ylabel(f'difference A − B ({unit})')
  legend_above(ax, ncol=2)
  return fig


def paired_diffs(out, out_dir):
  """Every pair's difference; None when there is no pair of arms with n ≥ 2."""
  if out['pairs'].empty:
    return None
  return style.save(draw_paired_diffs(out), out_dir, 'paired_diffs')


def band(ax, frame, x, col, color, label, scale=1.0):
  """Mean over runs of `col` per `x`, with a ± 1 sd band."""
  g = frame.groupby(x)[col]
  mean, sd = g.mean() * scale, g.std(ddof=1).fillna(0) * scale
  ax.fill_between(mean.index, mean - sd, mean + sd, color=color, alpha=0.18, linewidth=0)
  ax.plot(mean.index, mean, color=color, label=label)
  return mean, sd


def zoom_to_last_epochs(ax, spans):
  """x and y limits: the last half of the epochs, mean ± sd of every arm there."""
  first = max(m.index.max() for m, _ in spans) / 2
  low = min(float((m - s)[m.index >= first].min()) for m, s in spans)
  high = max(float((m + s)[m.index >= first].max()) for m, s in spans)
  pad = 0.15 * (high - low) or 0.5
  last = [m.index[m.index >= first] for m, _ in spans]
  ax.set_xlim(min(x.min() for x in last) - 0.2, max(x.max() for x in last) + 0.2)
  ax.set_ylim(low - pad, high + pad)


def plain_log_axis(axis):
  """A log axis labelled 0.2, 0.5, 1, 2 (not 2 × 10⁻¹)."""
  axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  axis.set_minor_formatter(ticker.NullFormatter())


def draw_training_curves(out, hist, steps):
  """The figure: training loss per logged step, test metric per epoch (zoomed); None if no data."""
  keep = out['runs'][['run', 'arm']]
  steps = steps.merge(keep, on='run') if not steps.empty else steps
  hist = hist.merge(keep, on='run') if not hist.empty and 'test_accuracy' in hist else hist.iloc[:0]
  if steps.empty and hist.empty:
    return None
  colors = style.arm_colors(out['arms']['arm'])
  fig, axes = plt.subplots(1, 2, figsize=(style.WIDTH_IN, 2.6))
  for arm, s in (steps.groupby('arm', sort=True) if not steps.empty else ()):
    band(axes[0], s, 'step', 'train_loss', colors[arm], f'{arm} (n = {s["run"].nunique()})')
  axes[0].set(xlabel='training step', ylabel='training loss', yscale='log')
  plain_log_axis(axes[0].yaxis)
  axes[0].set_title('Training loss per logged step', loc='left')
  spans = [band(axes[1], h, 'epoch', 'test_accuracy', colors[arm],
                f'{arm} (n = {h["run"].nunique()})', 100.0)
           for arm, h in (hist.groupby('arm', sort=True) if not hist.empty else ())]
  if spans:
    zoom_to_last_epochs(axes[1], spans)
  axes[1].set(xlabel='epoch', ylabel='test accuracy (%)')
  axes[1].set_title('Test accuracy, last epochs', loc='left')
  axes[1].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for ax in axes:
    ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
    ax.set_visible(bool(ax.get_lines()))
  handles, labels = next(a for a in axes if a.get_lines()).get_legend_handles_labels()
  fig.legend(handles, labels, loc='upper center', bbox_to_anchor=(0.5, 0.0),
             ncol=min(3, len(labels)), title='line: mean over runs; band: ± 1 sd')
  fig.tight_layout()
  return fig


def training_curves(out, hist, steps, out_dir):
  fig = draw_training_curves(out, hist, steps)
  return None if fig is None else style.save(fig, out_dir, 'training_curves')


def make_all(out, hist, out_dir, steps=None):
  """Write every figure that the data allow; returns the list of files written.

  `steps`: analysis.results.load_steps' table; None reads it from the analysed runs' folders.
  """
  from etils import epath  # pylint: disable=import-outside-toplevel
  from analysis import results  # pylint: disable=import-outside-toplevel
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  style.apply()
  if steps is None:
    steps = results.steps_frame(out['runs']['run'])
  written = accuracy_by_arm(out, out_dir)
  for paths in (paired_diffs(out, out_dir), training_curves(out, hist, steps, out_dir)):
    written += paths or []
  return written


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.figures', description=__doc__.split('\n')[0])
  p.add_argument('--runs', required=True, help='root holding the runs (local or gs://)')
  p.add_argument('--out', required=True, help='folder for the PDF and PNG files')
  p.add_argument('--group-by', nargs='+', default=[],
                 help='columns defining an arm (as analysis.stats; default: platform, device kind '
                      'and every requested numerics field)')
  p.add_argument('--metric', default=stats.DEFAULT_METRIC,
                 help=f'the final metric per arm (default {stats.DEFAULT_METRIC})')
  p.add_argument('--margin', type=float, default=None,
                 help=f'equivalence margin, pp (undeclared default {stats.DEFAULT_MARGIN:g})')
  p.add_argument('--margin-reason', default=None, help='why this margin')
  return p.parse_args(argv)


def main(argv=None):
  from analysis import results  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  try:
    runs, hist = results.load(args.runs)
    margin, reason = stats.margin_choice(args.margin, args.margin_reason)
    out = stats.analyse(runs, args.group_by, args.metric, margin, reason)
    steps = results.load_steps(args.runs)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  for path in make_all(out, hist, args.out, steps):
    print(path)


if __name__ == '__main__':
  main()
