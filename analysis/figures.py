"""Publication figures of a study, as PDF and 300-dpi PNG, in analysis/style.py's style.

  python -m analysis.figures --runs=/tmp/study --out=/tmp/study/figures [--group-by ...] [--margin 0.5]

Writes, for the runs that analysis.stats keeps (completed, one per seed and arm):
  accuracy_by_arm   per-arm metric: every seed (points), box (quartiles), mean ± 95% BCa CI
  paired_diffs      per-seed difference between arms sharing seeds, the report's Δ ± 90% CI
                    (paired ◆ or Welch ◇), and the ±margin band
  training_curves   test accuracy and test loss vs epoch: mean per arm, band = ± 1 sd over seeds
"""

import argparse
import sys

import numpy as np
from matplotlib.ticker import MaxNLocator

from analysis import stats, style

plt = style.plt


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
  """The legend in one row above the axes, outside the data."""
  ax.legend(loc='lower left', bbox_to_anchor=(0.0, 1.01), ncol=ncol, handletextpad=0.3,
            columnspacing=1.2, borderaxespad=0.0)


def unit_label(out):
  """Axis label of the metric, e.g. 'test accuracy (%)'."""
  name = out['metric'].rsplit('.', 1)[-1].replace('_', ' ')
  return f'{name} (%)' if out['scale'] == 100 else name


def accuracy_by_arm(out, out_dir):
  """Points per seed, a box per arm, and the mean with its 95% BCa CI (black)."""
  arms = out['arms']
  colors = style.arm_colors(arms['arm'])
  fig, ax = plt.subplots(figsize=(max(3.4, 1.3 * len(arms) + 0.8), 2.8))
  for i, arm in enumerate(arms['arm']):
    x = out['runs'].loc[out['runs']['arm'] == arm, 'value'].to_numpy()
    ax.boxplot([x], positions=[i], widths=0.5, showfliers=False, patch_artist=True,
               boxprops={'facecolor': colors[arm], 'alpha': 0.18, 'edgecolor': colors[arm]},
               medianprops={'color': colors[arm], 'linewidth': 1.0},
               whiskerprops={'color': colors[arm]}, capprops={'color': colors[arm]})
    ax.scatter(i - 0.05 + jitter(len(x), seed=i), x, s=11, color=colors[arm], alpha=0.85,
               linewidths=0, zorder=3, label='one seed' if i == 0 else None)
    row = arms.iloc[i]
    if np.isfinite(row['ci_low']):
      ax.errorbar(i + 0.32, row['mean'], yerr=[[row['mean'] - row['ci_low']], [row['ci_high'] - row['mean']]],
                  fmt='D', color='black', markersize=3.5, capsize=2.5, linewidth=0.9, zorder=4,
                  label='mean ± 95% BCa CI' if i == 0 else None)
    else:
      ax.plot(i + 0.32, row['mean'], 'D', color='black', markersize=3.5, zorder=4)
  ax.set_xticks(range(len(arms)), [f'{wrap(a)}\n(n = {n})' for a, n in zip(arms['arm'], arms['n'])])
  ax.set_xlim(-0.6, len(arms) - 0.3)
  ax.set_ylabel(unit_label(out))
  legend_above(ax)
  return style.save(fig, out_dir, 'accuracy_by_arm')


def paired_diffs(out, out_dir):
  """Per-seed difference A − B for every pair of arms sharing ≥ 2 seeds; None if there is none."""
  pairs = []
  runs = out['runs']
  for _, p in out['pairs'].iterrows():
    a = runs[runs['arm'] == p['arm_a']].set_index('seed')['value']
    b = runs[runs['arm'] == p['arm_b']].set_index('seed')['value']
    shared = sorted(set(a.index) & set(b.index), key=stats.seed_key)
    if len(shared) >= 2:
      pairs.append((p, shared, (a.loc[shared] - b.loc[shared]).to_numpy()))
  if not pairs:
    return None
  unit = 'pp' if out['scale'] == 100 else 'units'
  margin = out['margin']
  fig, ax = plt.subplots(figsize=(max(3.4, 1.4 * len(pairs) + 0.8), 2.8))
  ax.axhspan(-margin, margin, color='#009E73', alpha=0.10, linewidth=0,
             label=f'equivalence margin ±{margin:g} {unit}')
  ax.axhline(0, color='#555555', linewidth=0.6)
  for i, (p, shared, d) in enumerate(pairs):
    ax.scatter(i - 0.08 + jitter(len(d), seed=i), d, s=11, color='#0072B2', alpha=0.85, linewidths=0,
               zorder=3, label='one seed' if i == 0 else None)
    hollow = {} if p['paired'] else {'markerfacecolor': 'white'}
    ax.errorbar(i + 0.25, p['diff'], yerr=[[p['diff'] - p['ci90_low']], [p['ci90_high'] - p['diff']]],
                fmt='D', color='black', markersize=3.5, capsize=2.5, linewidth=0.9, zorder=4,
                label=None, **hollow)
  ax.errorbar([], [], yerr=[], fmt='D', color='black', markersize=3.5, capsize=2.5, linewidth=0.9,
              label='Δ ± 90% CI: paired ◆, Welch ◇')
  ax.set_xticks(range(len(pairs)), [f'{wrap(p["arm_a"])}\n−\n{wrap(p["arm_b"])}\n({len(s)} seeds)'
                                    for p, s, _ in pairs])
  ax.set_xlim(-0.6, len(pairs) - 0.4)
  ax.set_ylabel(f'difference A − B ({unit})')
  legend_above(ax)
  return style.save(fig, out_dir, 'paired_diffs')


def training_curves(out, hist, out_dir):
  """Test accuracy and test loss vs epoch: mean over seeds per arm and a ± 1 sd band."""
  keep = out['runs'][['run', 'arm']]
  hist = hist.merge(keep, on='run') if not hist.empty else hist
  if hist.empty:
    return None
  colors = style.arm_colors(out['arms']['arm'])
  fig, axes = plt.subplots(1, 2, figsize=(style.WIDTH_IN, 2.6))
  for ax, (col, name, scale) in zip(axes, (('test_accuracy', 'test accuracy (%)', 100.0),
                                           ('test_loss', 'test loss', 1.0))):
    if col not in hist:
      ax.set_visible(False)
      continue
    for arm, h in hist.groupby('arm', sort=True):
      g = h.groupby('epoch')[col]
      mean, sd = g.mean() * scale, g.std(ddof=1).fillna(0) * scale
      ax.fill_between(mean.index, mean - sd, mean + sd, color=colors[arm], alpha=0.18, linewidth=0)
      ax.plot(mean.index, mean, color=colors[arm], label=f'{arm} (n = {h["run"].nunique()})')
    ax.set_xlabel('epoch')
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(name)
    ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
  axes[0].set_title('Training curves (line: mean over seeds; band: ± 1 sd)', loc='left')
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='upper center', bbox_to_anchor=(0.5, 0.0),
             ncol=min(3, len(labels)))
  fig.tight_layout()
  return style.save(fig, out_dir, 'training_curves')


def make_all(out, hist, out_dir):
  """Write every figure that the data allow; returns the list of files written."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  style.apply()
  written = accuracy_by_arm(out, out_dir)
  for paths in (paired_diffs(out, out_dir), training_curves(out, hist, out_dir)):
    written += paths or []
  return written


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.figures', description=__doc__.split('\n')[0])
  p.add_argument('--runs', required=True, help='root holding the runs (local or gs://)')
  p.add_argument('--out', required=True, help='folder for the PDF and PNG files')
  p.add_argument('--group-by', nargs='+', default=[], help='columns defining an arm')
  p.add_argument('--metric', default=stats.DEFAULT_METRIC)
  p.add_argument('--margin', type=float, default=0.5, help='equivalence margin, pp')
  return p.parse_args(argv)


def main(argv=None):
  from analysis import results  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  try:
    runs, hist = results.load(args.runs)
    out = stats.analyse(runs, args.group_by, args.metric, args.margin)
  except ValueError as e:
    sys.exit(f'error: {e}')
  for path in make_all(out, hist, args.out):
    print(path)


if __name__ == '__main__':
  main()
