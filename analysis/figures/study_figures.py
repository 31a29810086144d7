"""The study's figures that show its arms: accuracy_by_arm, contrasts and training_curves
(analysis/catalogue.py lists every figure, what it shows and which command draws it; docs/
statistics.md "Report and figures"). Each is drawn at its printed size (style.ONE_COLUMN_IN,
TWO_COLUMN_IN) as vector PDF and 300-dpi PNG, for the runs analysis.numbers.stats keeps (completed;
replicates of a seed averaged): colour = platform, arms by their short labels (naming.short_labels)
and, in the training curves, by marker and line style; the study's context (naming.context) as the
subtitle; legends list only what is drawn, each key as it is drawn; y axes span the data.
"""

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.patches import Patch

from analysis.figures import forest, naming, style
from analysis.figures.curve_legend import crosses_platforms, drawn_entries, legend_entries

plt = style.plt
BOX_MIN_N = 10  # below this many seeds per arm a box (quartiles) says less than the points
MARKS = 6  # markers per training curve
SHADED_MAX = 4  # ± 1 sd bands only up to this many curves per panel: more overlap into grey


def jitter(n, width=0.08, seed=0):
  """Fixed horizontal offsets for n points (the same figure every time)."""
  return np.random.default_rng(seed).uniform(-width, width, n)


def wrap(label, inches, char_in=0.052):
  """The label on two lines, broken after a '_', ' ' or ',' near its middle, when it is wider
  than `inches` at 7 pt (about char_in inches per character)."""
  if len(label) * char_in <= inches * 0.92:
    return label
  cuts = [i + 1 for i, ch in enumerate(label) if ch in '_ ,']
  if not cuts:
    return label
  cut = min(cuts, key=lambda i: abs(i - len(label) / 2))
  return label[:cut].rstrip() + '\n' + label[cut:].lstrip()


def unit_label(out):
  """Axis label of the metric, e.g. 'test accuracy (%)'."""
  name = out.metric.rsplit('.', 1)[-1].replace('_', ' ')
  return f'{name} (%)' if out.scale == 100 else name


def once(label, seen):
  """`label` the first time it is asked for, None after (one legend entry per kind)."""
  if label in seen:
    return None
  seen.add(label)
  return label


def layout(out):
  """(categories in order, {arm: (category, platform)}, platforms in order): the short label of
  each arm and its platform when the study declares its arms, else the arm's short label
  (naming.short_labels: what differs between the arms, without its platform and device, which the
  colour shows) and the platform its runs record ('' when none)."""
  info = out.arm_info
  if info is None:
    first = out.runs.groupby('arm').first()

    def col(c):
      return first[c].astype(str) if c in first else pd.Series('', index=first.index)

    platform, device = col('platform'), col('device_kind')
    arms = list(out.arms['arm'])
    short = naming.short_labels(arms, {a: (platform.get(a, ''), device.get(a, '')) for a in arms})
    place = {a: (short[a], platform.get(a, '')) for a in arms}
    return (
      list(dict.fromkeys(short[a] for a in arms)),
      place,
      sorted({p for _, p in place.values()}),
    )
  place = {r.arm: (r.label, str(r.platform)) for r in info.itertuples()}
  return list(dict.fromkeys(info['label'])), place, sorted(set(map(str, info['platform'])))


def positions(categories, place, width=0.8):
  """{arm: x}: each category at its index, its platforms side by side within `width`."""
  present = {}
  for cat, platform in place.values():
    present.setdefault(cat, set()).add(platform)
  x = {}
  for arm, (cat, platform) in place.items():
    own = sorted(present[cat])
    step = width / len(own)
    x[arm] = categories.index(cat) + (own.index(platform) - (len(own) - 1) / 2) * step
  return x


def draw_box(ax, x, values, color, seen):
  ax.boxplot(
    [values],
    positions=[x],
    widths=0.22,
    showfliers=False,
    patch_artist=True,
    boxprops={'facecolor': color, 'alpha': 0.18, 'edgecolor': color},
    medianprops={'color': color, 'linewidth': 1.0},
    whiskerprops={'color': color},
    capprops={'color': color},
    label=once(f'quartiles (n ≥ {BOX_MIN_N})', seen),
  )


def draw_mean(ax, x, row, seen):
  """An arm's mean (black diamond at `x`) with its 95% CI, or alone where n < 2 gives none."""
  if np.isfinite(row.ci_low):
    ax.errorbar(
      x,
      row.mean,
      yerr=[[row.mean - row.ci_low], [row.ci_high - row.mean]],
      fmt='D',
      color='black',
      markersize=2.8,
      capsize=1.8,
      linewidth=0.8,
      zorder=4,
      label=once(f'mean ± 95% CI ({row.ci_method})', seen),
    )
  else:
    ax.plot(
      x,
      row.mean,
      'D',
      color='black',
      markersize=2.8,
      zorder=4,
      label=once('mean (n < 2: no CI)', seen),
    )


def draw_accuracy_by_arm(out):
  """The figure: points per seed (colour = platform, marker = arm), mean ± 95% CI (black), boxes
  only from BOX_MIN_N seeds."""
  categories, place, platforms = layout(out)
  colors, seen = style.platform_colors(platforms), set()
  x_of = positions(categories, place)
  width = 0.8 / max(len(platforms), 1)
  fig, ax = plt.subplots(figsize=(style.TWO_COLUMN_IN, 2.7), layout='constrained')
  naming.subtitle(fig, naming.context(out, 150))
  arms = sorted(out.arms.itertuples(), key=lambda r: categories.index(place[r.arm][0]))
  # in arm order: a platform's legend key shows the first arm's marker
  for i, row in enumerate(arms):
    (_, platform), x = place[row.arm], x_of[row.arm]
    values = out.units.loc[out.units['arm'] == row.arm, 'value'].to_numpy()
    c = colors[platform]
    if len(values) >= BOX_MIN_N:
      draw_box(ax, x, values, c, seen)
    name = (
      f'{platform}: one seed' if len(platforms) > 1 else ('one seed' if out.seeded else 'one run')
    )
    ax.scatter(
      x - width * 0.12 + jitter(len(values), width * 0.12, seed=i),
      values,
      s=8,
      marker='o',
      facecolors='none',
      edgecolors=c,
      alpha=0.85,
      linewidths=0.7,
      zorder=3,
      label=once(name, seen),
    )
    draw_mean(ax, x + width * 0.22, row, seen)
  ax.set_xticks(
    range(len(categories)), [wrap(c, style.TWO_COLUMN_IN / len(categories)) for c in categories]
  )
  ax.set_xlim(-0.5, len(categories) - 0.5)
  ax.set_ylabel(unit_label(out))
  handles, labels = ax.get_legend_handles_labels()
  handles = [
    Patch(facecolor='#DDDDDD', edgecolor='#777777') if label.startswith('quartiles') else h
    for h, label in zip(handles, labels, strict=True)
  ]  # a box of any platform: grey key
  ax.legend(handles, labels, loc='lower left', bbox_to_anchor=(0.0, 1.0), ncol=4, borderaxespad=0.2)
  return fig


def accuracy_by_arm(given, out_dir, name):
  """The figure of the study `given.result` (analysis/catalogue.py Figure) as NAME.pdf and .png."""
  style.apply()
  return style.save(draw_accuracy_by_arm(given.result), out_dir, name, crop=False)


def contrast_table(out):
  """The table the contrasts figure draws: the declared contrasts, or every pair labelled A − B."""
  if out.contrasts is not None:
    return out.contrasts
  pairs = out.pairs
  if pairs.empty:
    return pairs
  return pairs.assign(
    label=[f'{a} − {b}' for a, b in zip(pairs['arm_a'], pairs['arm_b'], strict=True)], platform=''
  )


def contrasts(given, out_dir, name):
  """forest.draw_contrasts of the study `given.result` as NAME.pdf and .png; [] without a pair."""
  out = given.result
  fig = forest.draw_contrasts(
    contrast_table(out),
    forest.floors_of(out.noise),
    out.margin,
    out.unit,
    context=naming.context(out, 68),
  )
  return [] if fig is None else style.save(fig, out_dir, name, crop=False)


def curve(frame, x, col, scale=1.0):
  """(mean, sd) over runs of `col` per `x` (sd 0 where one run)."""
  g = frame.groupby(x)[col]
  return g.mean() * scale, g.std(ddof=1).fillna(0) * scale


def markevery(n, k, arms):
  """Every MARK_EVERY-th of n points marked, arm k of `arms` starting at its own offset (so two
  coinciding curves show both markers)."""
  step = max(n // MARKS, 1)
  return (k * step // max(arms, 1) % step, step)


def band(ax, mean, sd, look, shade):
  """The mean line (look = (colour, (marker, line style), label, k, arms, under): arm k of `arms`,
  of the platform with `under` platforms drawn over it: its line and markers that much wider, so
  a curve another platform's covers exactly shows as a rim), with a ± 1 sd band when `shade`;
  returns (mean, sd drawn)."""
  color, (marker, linestyle), label, k, arms, under = look
  if shade:
    ax.fill_between(mean.index, mean - sd, mean + sd, color=color, alpha=0.15, linewidth=0)
  ax.plot(
    mean.index,
    mean,
    color=color,
    linestyle=linestyle,
    linewidth=1.0 + 1.0 * under,
    marker=marker,
    markevery=markevery(len(mean), k, arms),
    markersize=3.2 + 1.6 * under,
    markerfacecolor='none',
    markeredgewidth=0.7 + 0.3 * under,
    label=label,
    zorder=3 - under,
  )
  return mean, sd if shade else 0 * sd


def identical_to(panels, place, categories):
  """{arm: the earlier arm (category order) of its platform whose mean curves equal its own
  exactly in every panel}: identical arithmetic, drawn on top of each other."""
  same = {}
  arms = sorted(place, key=lambda a: categories.index(place[a][0]))
  for i, arm in enumerate(arms):
    for other in arms[:i]:
      if place[other][1] != place[arm][1] or other in same:
        continue
      shared = [p for p in panels if arm in p and other in p]
      if shared and all(p[arm][0].equals(p[other][0]) for p in shared):
        same[arm] = other
        break
  return same


def last_epochs(hist):
  """The evaluations of the last half of the epochs (the zoomed test-accuracy panel)."""
  return hist[hist['epoch'] >= hist['epoch'].max() / 2] if not hist.empty else hist


def zoom(ax, spans):
  """x and y limits around every arm's mean (± sd where shaded)."""
  low = min(float((m - s).min()) for m, s in spans)
  high = max(float((m + s).max()) for m, s in spans)
  pad = 0.08 * (high - low) or 0.5
  ax.set_xlim(
    min(m.index.min() for m, _ in spans) - 0.05, max(m.index.max() for m, _ in spans) + 0.05
  )
  ax.set_ylim(low - pad, high + pad)


def plain_log_axis(axis):
  """A log axis labelled 0.2, 0.5, 1, 2 (not 2 × 10⁻¹)."""
  axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  axis.set_minor_formatter(ticker.NullFormatter())


def curve_panels(out, hist, steps):
  """({arm: (mean, sd)} of the training loss per step, the same of the test metric (%) per epoch
  over the last half of the epochs), for the runs analysed."""
  keep = out.runs[['run', 'arm']]
  steps = steps.merge(keep, on='run') if not steps.empty else steps
  hist = hist.merge(keep, on='run') if not hist.empty and 'test_accuracy' in hist else hist.iloc[:0]
  loss = {
    a: curve(s, 'step', 'train_loss')
    for a, s in (steps.groupby('arm', sort=True) if not steps.empty else ())
  }
  test = {
    a: curve(h, 'epoch', 'test_accuracy', 100.0)
    for a, h in (last_epochs(hist).groupby('arm', sort=True) if not hist.empty else ())
  }
  return loss, test


def draw_training_curves(out, hist, steps):
  """The figure: training loss per logged step, test metric per epoch (zoomed); colour = platform,
  marker and line style = arm; None if no data."""
  categories, place, platforms = layout(out)
  loss, test = curve_panels(out, hist, steps)
  if not loss and not test:
    return None
  colors, styles = style.platform_colors(platforms), style.arm_styles(categories)
  same = identical_to((loss, test), place, categories)
  crossed = crosses_platforms(place)

  def name(a):
    return place[a][0] + (f' ({place[a][1]})' if crossed else '')

  def look(a):
    return (
      colors[place[a][1]],
      styles[place[a][0]],
      name(a) + (f' (identical to {place[same[a]][0]})' if a in same else ''),
      categories.index(place[a][0]),
      len(categories),
      len(platforms) - 1 - platforms.index(place[a][1]),
    )

  shade = len(place) <= SHADED_MAX
  fig, axes = plt.subplots(1, 2, figsize=(style.TWO_COLUMN_IN, 2.6), layout='constrained')
  naming.subtitle(fig, naming.context(out, 150))
  for a, (mean, sd) in loss.items():
    band(axes[0], mean, sd, look(a), shade)
  axes[0].set(xlabel='training step', ylabel='training loss', yscale='log')
  plain_log_axis(axes[0].yaxis)
  spans = [band(axes[1], mean, sd, look(a), shade) for a, (mean, sd) in test.items()]
  if spans:
    zoom(axes[1], spans)
  axes[1].set(xlabel='epoch (last half)', ylabel='test accuracy (%)')
  axes[1].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for ax in axes:
    ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
    ax.set_visible(bool(ax.get_lines()))
  rank = {look(a)[2]: categories.index(place[a][0]) for a in place}
  fig.legend(
    *(
      legend_entries(categories, place, same, colors, styles)
      if crossed
      else drawn_entries(axes, rank)
    ),
    loc='outside right upper',
    title='mean ± 1 sd over runs' if shade else 'mean over runs',
    title_fontsize=6.5,
    fontsize=6.5,
    handlelength=2.6,
  )
  return fig


def training_curves(given, out_dir, name):
  """draw_training_curves of `given` (its result, histories and steps) as NAME.pdf and .png; []
  without curves."""
  empty = pd.DataFrame(columns=['run'])
  hist = given.histories if given.histories is not None else empty
  steps = given.steps if given.steps is not None else empty
  style.apply()
  fig = draw_training_curves(given.result, hist, steps)
  return [] if fig is None else style.save(fig, out_dir, name, crop=False)
