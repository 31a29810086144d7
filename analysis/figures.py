"""The study's figures at their printed size, vector PDF and 300-dpi PNG, colour = platform
(Okabe–Ito): the forest plots, the metric per arm, the training curves, the churn ladder."""

import textwrap

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402 (after matplotlib.use: no display needed)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis import agreement, inputs  # noqa: E402

# Okabe & Ito (2008), without black (used for means) and yellow (too light on white paper).
PALETTE = ('#0072B2', '#D55E00', '#009E73', '#CC79A7', '#56B4E9', '#E69F00', '#999999', '#882255')
# Fixed colours of the platforms the project runs on; any other platform takes the next unused
# palette colour in sorted name order (platform_colors).
PLATFORM_COLORS = {'cpu': PALETTE[0], 'gpu': PALETTE[1], 'tpu': PALETTE[2]}
ACROSS_PLATFORMS = 'black'  # a quantity measured across platforms (a gap, a platform difference)
NO_PLATFORM = '#444444'  # runs that record no platform
# An arm's marker and line style; 'D' is left for estimates (forest plots, means).
ARM_MARKERS = ('o', 's', '^', 'v', 'P', 'X', '*', 'h', '<', '>')
DASHES = ((6, 1.5), (3, 1, 1, 1, 1, 1), (1, 2.5), (7, 2, 1.5, 2))
ARM_LINESTYLES = ('-', '--', ':', '-.', *((0, d) for d in DASHES))  # 8: the digits study's arms
WIDTH_IN = 6.5  # a full text width of a two-column-free paper, inches (the experiments' figures)
# The study's figures are drawn at their printed size (saved uncropped: save(..., crop=False)):
ONE_COLUMN_IN = 3.3  # one column of a two-column paper, inches
TWO_COLUMN_IN = 6.9  # both columns of a two-column paper, inches
RC = {
  'font.family': 'sans-serif',
  'font.sans-serif': ['DejaVu Sans', 'Arial', 'Helvetica'],
  'font.size': 8,
  'axes.titlesize': 9,
  'axes.labelsize': 8,
  'legend.fontsize': 7,
  'xtick.labelsize': 7,
  'ytick.labelsize': 7,
  'axes.spines.top': False,
  'axes.spines.right': False,
  'axes.linewidth': 0.6,
  'axes.grid': True,
  'axes.grid.axis': 'y',
  'grid.color': '#DDDDDD',
  'grid.linewidth': 0.5,
  'lines.linewidth': 1.2,
  'xtick.major.width': 0.6,
  'ytick.major.width': 0.6,
  'legend.frameon': False,
  'figure.dpi': 100,
  'savefig.dpi': 300,
  'savefig.bbox': 'tight',
  'savefig.pad_inches': 0.03,
  'pdf.fonttype': 42,
  'ps.fonttype': 42,
}


def apply():
  """Set the study's matplotlib style (idempotent)."""
  plt.rcParams.update(RC)


def arm_colors(arms):
  """{arm label: colour}, assigned in sorted label order so every figure agrees."""
  return {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(sorted(arms))}


def platform_colors(platforms):
  """{platform: colour}: PLATFORM_COLORS for cpu, gpu and tpu."""
  names = sorted(set(map(str, platforms)))
  spare = [c for c in PALETTE if c not in PLATFORM_COLORS.values()]
  others = [p for p in names if p and p not in PLATFORM_COLORS]
  out = {p: spare[others.index(p) % len(spare)] for p in others}
  out.update({p: PLATFORM_COLORS[p] for p in names if p in PLATFORM_COLORS})
  return {p: out.get(p, NO_PLATFORM) for p in names}


def save(fig, out_dir, name, crop=True):
  """Write `name`.pdf and `name`.png (300 dpi) into out_dir; returns the two paths."""
  paths = [f'{out_dir}/{name}.pdf', f'{out_dir}/{name}.png']
  with matplotlib.rc_context({'savefig.bbox': 'tight' if crop else 'standard'}):
    for path in paths:
      fig.savefig(path)
  plt.close(fig)
  return paths


LABEL_CHARS = 30  # an arm label longer than this is cut (with '…'): a legend, not a config dump
NAMED = ('profile=',)  # fields whose value names itself: 'tpu_default', not 'profile=tpu_default'
ONE_ARM = 'all runs'  # the label of the only arm: nothing tells it from another


def cut(text):
  """`text` in at most LABEL_CHARS characters ('…' where cut)."""
  return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1].rstrip(', ') + '…'


def short_labels(labels, drop=(), one=ONE_ARM):
  """{label: short label}: what differs between the arms 'a, b=1, c=2', at most LABEL_CHARS."""
  labels = list(dict.fromkeys(map(str, labels)))
  if len(labels) == 1:
    return {labels[0]: one or cut(labels[0])}
  parts = {
    label: [p for p in label.split(', ') if p not in set((drop or {}).get(label, ()))]
    or label.split(', ')
    for label in labels
  }
  common = set.intersection(*(set(p) for p in parts.values()))
  out = {}
  for label in labels:
    keep = [p for p in parts[label] if p not in common] or parts[label][:1]
    keep = [p.split('=', 1)[1] if p.startswith(NAMED) else p for p in keep]
    out[label] = cut(', '.join(p for p in keep if p) or label)
  seen = {}
  for label in labels:  # cut labels that collide get a number
    seen.setdefault(out[label], []).append(label)
  for text, group in seen.items():
    if len(group) > 1 and text.endswith('…'):
      out.update({label: f'{text} {i + 1}' for i, label in enumerate(group)})
  return out


def context_line(out, width=None):
  """'digits (test 360 images) · n = 16 seeds per arm, 256 runs · cpu: cpu; gpu: NVIDIA H100'."""
  runs = out.runs
  data = inputs.recorded(runs, 'config.data.name', 'data.name')
  test = inputs.recorded(runs, 'data.test_size')
  n = sorted(set(out.arms['n'])) if not out.arms.empty else [0]
  units = getattr(out, 'units', None)
  models = bool(
    out.seeded
    and units is not None
    and units['seed'].astype(str).str.contains(' (init ', regex=False).any()
  )
  what = ('model' if models else 'seed' if out.seeded else 'run') + ('' if n == [1] else 's')
  what += ' (seed, init, data)' if models else ''
  each = f'{n[0]}' if len(n) == 1 else f'{n[0]}–{n[-1]}'
  devices = '; '.join(
    f'{p}: {f.device_kind}' if f.device_kind and f.device_kind.lower() != p.lower() else p
    for p, f in out.software.platforms.items()
  )
  runs_text = f'{len(runs)} run{"" if len(runs) == 1 else "s"}'
  parts = [
    f'{data} (test {test} images)' if data and test else data or 'data set not recorded',
    f'n = {each} {what} per arm, {runs_text}',
    devices or 'platform not recorded',
  ]
  text = ' · '.join(parts)
  return '\n'.join(textwrap.wrap(text, width)) if width else text


def subtitle(fig, text):
  """The context line as the figure's subtitle, left-aligned above the axes."""
  fig.suptitle(text, x=0.01, ha='left', fontsize=6.5, color='#444444')


ROW_IN = 0.2  # height of one row, inches
# The gap's components in the forest's order: key -> row label ({a}, {b}: the platforms; e_A, e_B,
# the profiles emulating them, are named in the panel's title).
COMPONENT_ROWS = (
  ('G', 'G  native gap'),
  ('fid_A', 'fid_A  fidelity on {a}'),
  ('fid_B', 'fid_B  fidelity on {b}'),
  ('N_A', 'N_A  numerics on {a}'),
  ('N_B', 'N_B  numerics on {b}'),
  ('N', 'N  numerics part'),
  ('N_interaction', 'N_A − N_B'),
  ('P_eA', 'P_eA  platforms under e_A'),
  ('P_eB', 'P_eB  platforms under e_B'),
  ('P', 'P  platform part'),
  ('R', 'R  residual G − N'),
)
# The gap figure's rows: (key, sign with which it enters G = fid_A − fid_B + N + P, label); the
# identity itself is the x label, so no row label starts with an operator.
SUM_ROWS = (
  ('G', 1, 'native gap G ({a} − {b})'),
  ('fid_A', 1, 'fidelity on {a}: fid_A'),
  ('fid_B', -1, 'fidelity on {b}, negated: −fid_B'),
  ('N', 1, 'numerics part N'),
  ('P', 1, 'platform part P'),
  ('R', 1, 'residual R = G − N'),
)


def frame_height(rows, extra=0.9, row=ROW_IN):
  """Figure height (inches) for `rows` rows of `row` inches plus legend and axis label."""
  return extra + row * max(rows, 1)


def one_column(rows, extra, context=None, row=ROW_IN):
  """A one-column figure and its axes for `rows` rows, `context` (context_line) as its caption
  under the axes, left-aligned."""
  extra += 0.12 * (context.count('\n') + 1) if context else 0
  size = (ONE_COLUMN_IN, frame_height(rows, extra=extra, row=row))
  fig, ax = plt.subplots(figsize=size, layout='constrained')
  if context:
    fig.supxlabel(context, x=0.01, ha='left', fontsize=6, color='#444444')
  return fig, ax


def floors_of(noise):
  """{platform: 95% half-width} of a noise dict ({platform: stats.NoiseFloor})."""
  return {p: f.half for p, f in (noise or {}).items() if f and np.isfinite(f.half)}


def draw_limits(ax, margin, floors, unit, label=True):
  """Zero line, ±margin (dashed) and one noise band ±half per platform ({platform: half}) in the
  platform's colour, widest first, each with its own legend label unless `label` is False."""
  colors = platform_colors(floors)
  for p, half in sorted(floors.items(), key=lambda item: -item[1]):
    if half > 0:
      name = f'noise floor {p} ±{half:.2f} {unit}' if p else f'noise floor ±{half:.2f} {unit}'
      look = dict(facecolor=to_rgba(colors[p], 0.1), edgecolor=to_rgba(colors[p], 0.8))
      ax.axvspan(-half, half, linewidth=0.7, **look, label=name if label else None)
  if margin:
    for sign in (-1, 1):
      name = f'margin ±{margin:g} {unit}' if sign > 0 and label else None
      ax.axvline(sign * margin, color='black', linestyle='--', linewidth=0.7, label=name)
  ax.axvline(0, color='#555555', linewidth=0.6)


def draw_interval(
  ax, y, est, ci95, ci90=None, color=ACROSS_PLATFORMS, filled=True, labels=(None,) * 3
):
  """A diamond at `est`, a thin 95% CI line and, when given, a thick 90% CI line; `labels`."""
  ax.plot(ci95, [y, y], color=color, linewidth=0.8, solid_capstyle='butt', label=labels[1])
  if ci90 is not None and np.isfinite(ci90[0]):
    ax.plot(
      ci90, [y, y], color=color, linewidth=2.4, alpha=0.55, solid_capstyle='butt', label=labels[2]
    )
  face = color if filled else 'white'
  look = dict(color=color, markersize=3.4, markerfacecolor=face, markeredgewidth=0.8)
  ax.plot([est], [y], 'D', **look, label=labels[0], zorder=3)


def rows_axis(ax, labels, xlabel=None):
  """Row labels top to bottom, the x label, an x grid."""
  n = len(labels)
  ax.set_yticks(np.arange(n)[::-1], labels)
  ax.set_ylim(-0.6, n - 0.4)
  ax.grid(axis='y', visible=False)
  ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
  ax.tick_params(axis='y', length=0)
  if xlabel:
    ax.set_xlabel(xlabel)


def legend_above(fig, handles, labels):
  """The figure's legend above the axes, inside the figure (none without entries)."""
  if handles:
    look = dict(ncol=2, handlelength=1.6, columnspacing=1.0, fontsize=6.5)
    fig.legend(handles, labels, loc='outside upper center', **look)


def component_color(key, platforms, colors):
  """The platform's colour (`colors`: platform_colors of every platform the figure shows) for a
  component measured on one platform, else ACROSS_PLATFORMS."""
  on = {'fid_A': platforms[0], 'N_A': platforms[0], 'fid_B': platforms[1], 'N_B': platforms[1]}
  return colors[on[key]] if key in on else ACROSS_PLATFORMS


def draw_rows(ax, rows, labels=(None,) * 3):
  """One interval per row (label, estimate, ci95, ci90 or None, colour, note) top to bottom."""
  for y, (_, est, ci, ci90, color, note) in zip(np.arange(len(rows))[::-1], rows, strict=True):
    if note:
      ax.text(0, y, 'not estimable', ha='center', va='center', fontsize=6, color='#777777')
      continue
    draw_interval(
      ax, y, est, ci, ci90, color=color, labels=labels if y == len(rows) - 1 else (None,) * 3
    )
  rows_axis(ax, [r[0] for r in rows])


def platform_keys(out):
  """Legend keys of the gaps' platforms: an estimate in each one's colour, and across them."""
  platforms = sorted({p for d in out.decomposition or [] for p in d.platforms})
  colors = platform_colors(platforms)
  keys = [(colors[p], f'on {p}') for p in platforms] + [(ACROSS_PLATFORMS, 'across platforms')]
  handles = [Line2D([], [], color=c, marker='D', markersize=3.4, linewidth=0.8) for c, _ in keys]
  return handles, [t for _, t in keys]


def draw_forest(out):
  """The attribution forest: a panel per gap (COMPONENT_ROWS) and one of main effects."""
  apply()
  groups, labels = [], out.labels or {}
  colors = platform_colors({p for d in out.decomposition or [] for p in d.platforms})
  for d in out.decomposition or []:
    (a, b), (ea, eb) = d.platforms, d.profiles
    rows = out.gap[out.gap['gap'] == d.gap].set_index('key')
    group = [
      (
        label.format(a=a, b=b),
        rows.loc[k, 'estimate'],
        [rows.loc[k, 'ci_low'], rows.loc[k, 'ci_high']],
        None,
        component_color(k, (a, b), colors),
        rows.loc[k, 'note'],
      )
      for k, label in COMPONENT_ROWS
      if k in rows.index
    ]
    groups.append((f'gap {a} − {b}, {d.seeds} seeds\ne_A = {ea}, e_B = {eb}', group))
  effects = []
  for r in out.terms.itertuples():
    # does the term (factor=level, or an interaction a:b) involve the platform?
    platform = any(
      part.partition('=')[0].rsplit('.', 1)[-1] == 'platform' for part in r.term.split(':')
    )
    if platform and out.decomposition:
      continue
    label = labels.get(r.term, r.term) + (', mean over all arms' if platform else '')
    effects.append((label, r.estimate, [r.ci_low, r.ci_high], None, ACROSS_PLATFORMS, ''))
  title = (
    'main effects of the other factors\n(additive model over every arm)'
    if out.decomposition
    else 'main effects (additive model)'
  )
  groups = [g for g in [*groups, (title, effects)] if g[1]]
  sizes = [len(rows) + 2.2 for _, rows in groups]  # rows plus the panel's title
  size = (ONE_COLUMN_IN, frame_height(sum(sizes), extra=1.0))
  look = dict(sharex=True, height_ratios=sizes, squeeze=False, layout='constrained')
  fig, axes = plt.subplots(len(groups), 1, figsize=size, **look)
  floors = floors_of(out.noise)
  for i, (ax, (title, rows)) in enumerate(zip(axes[:, 0], groups, strict=True)):
    draw_limits(ax, out.margin, floors, out.unit, label=i == 0)
    draw_rows(ax, rows)
    ax.set_title(title, loc='left', fontsize=6.5, pad=3)
  axes[-1, 0].set_xlabel(f'estimate ± 95% CI ({out.unit})')
  handles, texts = axes[0, 0].get_legend_handles_labels()
  keys, names = platform_keys(out) if out.decomposition else ([], [])
  legend_above(fig, handles + keys, texts + names)
  return fig


def verdict_line(d, unit):
  """'<verdict> at ±m unit': the second line of a pair's gap row."""
  return f'{d.verdict} at ±{d.margin:g} {unit}' if d.margin else d.verdict


def draw_gap(out, context=None):
  """The figure: per gap (out.decomposition) G and its parts as they enter G (SUM_ROWS)."""
  parts = out.decomposition or []
  if not parts:
    return None
  apply()
  rows, colors = [], platform_colors({p for d in parts for p in d.platforms})
  for d in parts:
    (a, b), table = d.platforms, out.gap[out.gap['gap'] == d.gap].set_index('key')
    for key, sign, label in SUM_ROWS:
      r = table.loc[key]
      ci = sorted([sign * r['ci_low'], sign * r['ci_high']])
      ci90 = [r['ci90_low'], r['ci90_high']] if key in ('G', 'R') else None
      text = label.format(a=a, b=b) + (f':\n{verdict_line(d, out.unit)}' if key == 'G' else '')
      rows.append(
        (text, sign * r['estimate'], ci, ci90, component_color(key, (a, b), colors), r['note'])
      )
  fig, ax = one_column(len(rows), 1.25, context, row=0.27)
  draw_limits(ax, parts[0].margin, floors_of(out.noise), out.unit)
  draw_rows(ax, rows, (None, '95% CI', '90% CI (TOST)'))
  ax.set_xlabel(
    f'each part as it enters the gap ({out.unit}):\nG = fid_A − fid_B + N + P', loc='right'
  )  # under the axes, not past the figure's edge
  for k in range(1, len(rows)):  # a rule above each residual row and between gaps
    if rows[k][0].startswith('residual') or rows[k][0].startswith('native gap'):
      ax.axhline(len(rows) - k - 0.5, color='#BBBBBB', linewidth=0.5)
  handles, labels = ax.get_legend_handles_labels()
  keys, names = platform_keys(out)
  legend_above(fig, handles + keys, labels + names)
  return fig


def draw_contrasts(table, noise, margin, unit, context=None):
  """The figure: one row per contrast label, an interval per platform (hollow: unpaired)."""
  if table is None or table.empty:
    return None
  apply()
  rows = list(dict.fromkeys(table['label']))
  platforms = list(dict.fromkeys(table['platform']))
  colors = platform_colors(platforms)
  fig, ax = one_column(len(rows), 1.1, context)
  draw_limits(ax, margin, {p: h for p, h in noise.items() if h}, unit)
  step = 0.32 / max(len(platforms) - 1, 1)
  offsets = {p: 0.16 - i * step if len(platforms) > 1 else 0.0 for i, p in enumerate(platforms)}
  seen = set()
  for r in table.itertuples():
    y = len(rows) - 1 - rows.index(r.label) + offsets[r.platform]
    key = r.platform if len(platforms) > 1 else 'Δ'
    labels = (None if key in seen else key, *(('95% CI', '90% CI') if not seen else (None, None)))
    ci95, ci90 = [r.ci95_low, r.ci95_high], [r.ci90_low, r.ci90_high]
    draw_interval(
      ax, y, r.diff, ci95, ci90, color=colors[r.platform], filled=r.paired, labels=labels
    )
    seen.add(key)
  rows_axis(ax, rows, f'arm − reference arm ({unit})')
  handles, labels = ax.get_legend_handles_labels()
  handles = [
    Line2D([], [], color='#333333', linewidth=h.get_linewidth(), alpha=h.get_alpha())
    if t.startswith(('95% CI', '90% CI'))
    else h
    for h, t in zip(handles, labels, strict=True)
  ]  # the interval keys in dark grey: they stand for every platform
  legend_above(fig, handles, labels)
  return fig


BOX_MIN_N = 10  # below this many seeds per arm a box (quartiles) says less than the points
MARKS = 6  # markers per training curve
SHADED_MAX = 4  # ± 1 sd bands only up to this many curves per panel: more overlap into grey


def wrap(label, inches, char_in=0.052):
  """The label on two lines, broken after a '_', ' ' or ',' near its middle."""
  if len(label) * char_in <= inches * 0.92:
    return label
  cuts = [i + 1 for i, ch in enumerate(label) if ch in '_ ,']
  if not cuts:
    return label
  cut = min(cuts, key=lambda i: abs(i - len(label) / 2))
  return label[:cut].rstrip() + '\n' + label[cut:].lstrip()


def once(label, seen):
  """`label` the first time it is asked for, None after (one legend entry per kind)."""
  if label in seen:
    return None
  seen.add(label)
  return label


def layout(out):
  """(categories in order, {arm: (category, platform)}, platforms in order)."""
  info = out.arm_info
  if info is None:
    first = out.runs.groupby('arm').first()

    def col(c):
      return first[c].astype(str) if c in first else pd.Series('', index=first.index)

    platform, device = col('platform'), col('device_kind')
    arms = list(out.arms['arm'])
    short = short_labels(arms, {a: (platform.get(a, ''), device.get(a, '')) for a in arms})
    place = {a: (short[a], platform.get(a, '')) for a in arms}
    categories = list(dict.fromkeys(short[a] for a in arms))
    return categories, place, sorted({p for _, p in place.values()})
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
    x[arm] = categories.index(cat) + (own.index(platform) - (len(own) - 1) / 2) * (width / len(own))
  return x


def draw_accuracy_by_arm(out):
  """The figure: points per seed (colour = platform), mean ± 95% CI (black), quartiles from
  BOX_MIN_N seeds."""
  categories, place, platforms = layout(out)
  colors, seen = platform_colors(platforms), set()
  x_of = positions(categories, place)
  width = 0.8 / max(len(platforms), 1)
  fig, ax = plt.subplots(figsize=(TWO_COLUMN_IN, 2.7), layout='constrained')
  subtitle(fig, context_line(out, 150))
  arms = sorted(out.arms.itertuples(), key=lambda r: categories.index(place[r.arm][0]))
  # in arm order: a platform's legend key shows the first arm's marker
  for i, row in enumerate(arms):
    (_, platform), x = place[row.arm], x_of[row.arm]
    values = out.units.loc[out.units['arm'] == row.arm, 'value'].to_numpy()
    c = colors[platform]
    if len(values) >= BOX_MIN_N:
      box = dict(boxprops={'facecolor': c, 'alpha': 0.18, 'edgecolor': c}, patch_artist=True)
      box |= dict(medianprops={'color': c, 'linewidth': 1.0}, whiskerprops={'color': c})
      box |= dict(capprops={'color': c}, widths=0.22, showfliers=False)
      ax.boxplot([values], positions=[x], **box, label=once(f'quartiles (n ≥ {BOX_MIN_N})', seen))
    name = (
      f'{platform}: one seed' if len(platforms) > 1 else ('one seed' if out.seeded else 'one run')
    )
    jitter = np.random.default_rng(i).uniform(-width * 0.12, width * 0.12, len(values))  # fixed
    look = dict(s=8, marker='o', facecolors='none', edgecolors=c, alpha=0.85, linewidths=0.7)
    ax.scatter(x - width * 0.12 + jitter, values, **look, zorder=3, label=once(name, seen))
    at, dot = x + width * 0.22, dict(color='black', markersize=2.8, zorder=4)  # mean, 95% CI
    if not np.isfinite(row.ci_low):
      ax.plot(at, row.mean, 'D', **dot, label=once('mean (n < 2: no CI)', seen))
    else:
      bar = [[row.mean - row.ci_low], [row.ci_high - row.mean]]
      label = once(f'mean ± 95% CI ({row.ci_method})', seen)
      ax.errorbar(at, row.mean, yerr=bar, fmt='D', **dot, capsize=1.8, linewidth=0.8, label=label)
  ax.set_xticks(
    range(len(categories)), [wrap(c, TWO_COLUMN_IN / len(categories)) for c in categories]
  )
  ax.set_xlim(-0.5, len(categories) - 0.5)
  metric = out.metric.rsplit('.', 1)[-1].replace('_', ' ')
  ax.set_ylabel(f'{metric} (%)' if out.scale == 100 else metric)
  handles, labels = ax.get_legend_handles_labels()
  handles = [
    Patch(facecolor='#DDDDDD', edgecolor='#777777') if label.startswith('quartiles') else h
    for h, label in zip(handles, labels, strict=True)
  ]  # a box of any platform: grey key
  ax.legend(handles, labels, loc='lower left', bbox_to_anchor=(0.0, 1.0), ncol=4, borderaxespad=0.2)
  return fig


def contrast_table(out):
  """The table the contrasts figure draws: the declared contrasts, or every pair labelled A − B."""
  if out.contrasts is not None:
    return out.contrasts
  pairs = out.pairs
  if pairs.empty:
    return pairs
  labels = [f'{a} − {b}' for a, b in zip(pairs['arm_a'], pairs['arm_b'], strict=True)]
  return pairs.assign(label=labels, platform='')


def curve(frame, x, col, scale=1.0):
  """(mean, sd) over runs of `col` per `x` (sd 0 where one run)."""
  g = frame.groupby(x)[col]
  return g.mean() * scale, g.std(ddof=1).fillna(0) * scale


def arm_look(k):
  """The k-th arm label's colour, marker and line style (the same on every platform's row)."""
  look = dict(color=PALETTE[k % len(PALETTE)], marker=ARM_MARKERS[k % len(ARM_MARKERS)])
  look |= dict(linestyle=ARM_LINESTYLES[k % len(ARM_LINESTYLES)], markerfacecolor='none')
  return look | dict(markersize=3.2, markeredgewidth=0.7, linewidth=1.0)


def draw_curve(ax, mean, sd, k, n, shade, label):
  """Arm k of n (`label`): its mean line, ± sd shaded; its markers start at its own offset, so that
  curves drawn on top of each other stay apart."""
  look = arm_look(k)
  if shade:
    ax.fill_between(mean.index, mean - sd, mean + sd, color=look['color'], alpha=0.15, lw=0)
  step = max(len(mean) // MARKS, 1)
  ax.plot(mean.index, mean, markevery=(k * step // max(n, 1) % step, step), label=label, **look)


def identical_to(panels, labels):
  """{label: the earlier label whose mean curves equal its own exactly in every panel} of one
  platform: identical arithmetic, drawn on top of each other."""
  same = {}
  for i, label in enumerate(labels):
    for other in labels[:i]:
      shared = [p for p in panels if label in p and other in p]
      if other not in same and shared and all(p[label][0].equals(p[other][0]) for p in shared):
        same[label] = other
        break
  return same


def draw_training_curves(out, hist, steps):
  """One row per platform: training loss per logged step, the test metric per epoch, and its
  difference from the platform's first arm (the reference where declared), which is where arms
  whose curves overlap are told apart. Colour, marker and line style are the arm's."""
  categories, place, platforms = layout(out)
  keep = out.runs[['run', 'arm']]
  steps = steps.merge(keep, on='run') if not steps.empty else steps
  hist = hist.merge(keep, on='run') if not hist.empty and 'test_accuracy' in hist else hist.iloc[:0]
  loss = {p: {} for p in platforms}
  test = {p: {} for p in platforms}
  for a, s in steps.groupby('arm', sort=True) if not steps.empty else ():
    loss[place[a][1]][place[a][0]] = curve(s, 'step', 'train_loss')
  for a, h in hist.groupby('arm', sort=True) if not hist.empty else ():
    test[place[a][1]][place[a][0]] = curve(h, 'epoch', 'test_accuracy', 100.0)
  rows = [p for p in platforms if loss[p] or test[p]]
  if not rows:
    return None
  names = ['training loss'] * bool(steps.size) + ['test accuracy (%)'] * bool(hist.size) * 2
  size = (TWO_COLUMN_IN, 0.5 + 2.1 * len(rows))
  look = dict(sharex='col', sharey='col', squeeze=False, layout='constrained')
  fig, axes = plt.subplots(len(rows), len(names), figsize=size, **look)
  subtitle(fig, context_line(out, 150))
  shade = max(max(len(loss[p]), len(test[p])) for p in rows) <= SHADED_MAX
  notes = {}
  for row, p in zip(axes, rows, strict=True):
    order = [c for c in categories if c in loss[p] or c in test[p]]
    for label, other in identical_to((loss[p], test[p]), order).items():
      notes.setdefault(label, []).append(f'= {other}' + (f' on {p}' if len(rows) > 1 else ''))
    base = next((c for c in order if c in test[p]), None)
    panels = [(loss[p], shade)] * bool(steps.size) + [(test[p], shade)] * bool(hist.size)
    if hist.size:  # each arm's mean minus the base arm's, over the epochs both have
      panels.append(({c: (m - test[p][base][0], 0 * m) for c, (m, _) in test[p].items()}, False))
    for ax, (curves, shaded) in zip(row, panels, strict=True):
      for c, (mean, sd) in curves.items():
        draw_curve(ax, mean.dropna(), sd, categories.index(c), len(categories), shaded, c)
    prefix = f'{p}: ' if len(rows) > 1 else ''
    for ax, name in zip(row, names, strict=True):
      ax.set_ylabel(prefix + name, fontsize=7)
      ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
    if hist.size:
      row[-1].set_ylabel(wrap(f'{prefix}test accuracy − {base} (pp)', 1.8), fontsize=7)
      row[-1].axhline(0, color='#999999', linewidth=0.5, zorder=0)
  for ax, name in zip(axes[-1], names, strict=True):
    ax.set_xlabel('training step' if name == 'training loss' else 'epoch')
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=5, integer=True))
  if steps.size:
    for ax in axes[:, 0]:
      ax.set_yscale('log')
      ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.2, 0.5, 1, 2
      ax.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
      ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  drawn = [c for c in categories if any(c in loss[p] or c in test[p] for p in rows)]
  handles = [Line2D([], [], **arm_look(categories.index(c))) for c in drawn]
  labels = [c + (f' ({", ".join(notes[c])})' if c in notes else '') for c in drawn]
  title = 'mean ± 1 sd over runs' if shade else 'mean over runs'
  look = dict(title_fontsize=6.5, fontsize=6.5, handlelength=2.6)
  fig.legend(
    handles, [wrap(t, 1.3) for t in labels], loc='outside right upper', title=title, **look
  )
  return fig


LADDER_ROW_IN = 0.17  # inches per row
LADDER_LABEL_CHARS = 66
# What a row's n counts (agreement.py: the units its interval is over).
UNITS = {
  'data order': 'init seeds',
  'init': 'data seeds',
  'seed': 'seed pairs',
  'seed_all': 'clusters',
}
MAX_ROWS = 48  # beyond this many rows a page is unreadable: the numerics rows are cut to fit


def drawn_rows(table):
  """(the rows drawn, how many numerics-setting rows are left out to keep MAX_ROWS)."""
  pooled = set(table.loc[table['kind'] == 'seed_all', 'platform_a'])
  table = table[~((table['kind'] == 'seed') & table['platform_a'].isin(pooled))]
  if len(table) <= MAX_ROWS:
    return table, 0
  contrast = table['kind'] == 'contrast'
  keep = max(MAX_ROWS - int((~contrast).sum()), 0)
  dropped = table[contrast].index[keep:]
  return table.drop(index=dropped), len(dropped)


def row_label(row, short=None):
  """'kind: a vs b (n 8)' (one arm: 'kind: a (n 8)'), arms by their short labels ({label: short},
  short_labels), wrapped."""
  short = short or {}
  kind = agreement.SHORT_TITLES[row['kind']]
  a, b = (short.get(x, x) for x in (row.get('label_a', row['a']), row.get('label_b', row['b'])))
  head = a.split(': ')[0] + ': '
  if ': ' in a and b.startswith(head):  # 'cpu: f32 vs cpu: native' -> 'cpu: f32 vs native'
    b = b[len(head) :]
  pair = a if row['a'] == row['b'] else f'{a} vs {b}'
  what = UNITS.get(row['kind'], 'seeds')
  return textwrap.fill(f'{kind}: {pair} ({int(row["seeds"])} {what})', LADDER_LABEL_CHARS)


def per_seed(row):
  return [float(v) for v in str(row['per_seed_pct']).split(', ') if v]


def draw_churn_ladder(table, context=None):
  """The ladder's figure (matplotlib Figure); `context` (context_line) as its subtitle."""
  table, left_out = drawn_rows(table)
  apply()
  platforms = sorted(set(table['platform_a']) | set(table['platform_b']))
  colors = platform_colors(platforms)
  arms = [
    x
    for _, r in table.iterrows()
    for x in (r.get('label_a', r['a']), r.get('label_b', r['b']))
    if not str(x).startswith('every arm on ')
  ]
  short = short_labels(arms, one=None)  # one declared arm keeps its own label
  labels = [row_label(r, short) for _, r in table.iterrows()]
  lines = sum(label.count('\n') + 1 for label in labels)
  fig, ax = plt.subplots(
    figsize=(TWO_COLUMN_IN, 1.1 + LADDER_ROW_IN * max(lines, 2)), constrained_layout=True
  )
  if context:
    subtitle(fig, context)
  for y, (_, r) in enumerate(table.iterrows()):
    color = colors[r['platform_a']] if r['platform_a'] == r['platform_b'] else ACROSS_PLATFORMS
    if np.isfinite(r['ci_low']):
      ax.plot([r['ci_low'], r['ci_high']], [y, y], color=color, lw=1.2)
    ax.plot(per_seed(r), [y] * len(per_seed(r)), '.', color=color, ms=2.5, alpha=0.45)
    ax.plot([r['churn_pct']], [y], 'o', color=color, ms=4)
  ax.set_yticks(range(len(table)), labels, fontsize=6.5)
  ax.invert_yaxis()
  # the x axis ends 8 % past the largest interval bound or per-seed value drawn
  values = [
    v
    for _, r in table.iterrows()
    for v in (r['ci_high'], r['churn_pct'], *per_seed(r))
    if np.isfinite(v)
  ]
  ax.set_xlim(0, min(100.0, max(1.0, 1.08 * max(values, default=1.0))))
  ax.grid(axis='x', color='#DDDDDD', lw=0.5)
  ax.grid(axis='y', visible=False)
  unit = ' / '.join(sorted(set(table['unit'])))
  ax.set_xlabel(
    f'churn: % of test {unit} predicted differently\n(mean over seeds, 95% '
    't-Wilson interval; dots: seeds; n in brackets)'
  )
  handles = [ax.plot([], [], 'o', color=colors[p], label=p)[0] for p in platforms]
  if (table['platform_a'] != table['platform_b']).any():
    handles.append(ax.plot([], [], 'o', color=ACROSS_PLATFORMS, label='across platforms')[0])
  fig.legend(handles=handles, loc='outside upper right', ncol=len(handles), fontsize=6.5)
  if left_out:
    note = f'{left_out} numerics-setting pairs not drawn (MAX_ROWS): see report_agreement.csv'
    ax.set_title(note, fontsize=7)
  return fig


def study_figures(out, hist, steps, folder):
  """The study's figures of the analysis `out` (stats.Analysis) that its data allow."""
  apply()
  figs = {'accuracy_by_arm': draw_accuracy_by_arm(out)}
  figs['contrasts'] = draw_contrasts(
    contrast_table(out), floors_of(out.noise), out.margin, out.unit, context=context_line(out, 68)
  )
  att = out.attribution
  figs['gap_decomposition'] = draw_gap(att, context_line(out, 68)) if att is not None else None
  empty = pd.DataFrame(columns=['run'])
  figs['training_curves'] = draw_training_curves(
    out, empty if hist is None else hist, empty if steps is None else steps
  )
  table = out.agreement.table if out.agreement else None
  ladder = table is not None and not table.empty
  figs['churn_ladder'] = draw_churn_ladder(table, context_line(out, 150)) if ladder else None
  return [p for name, fig in figs.items() if fig for p in save(fig, folder, name, crop=False)]


def attribution_figures(att, folder):
  """The attribution's figures as NAME.pdf and .png into `folder`: gap_decomposition, forest."""
  apply()
  figs = {'gap_decomposition': draw_gap(att), 'attribution_forest': draw_forest(att)}
  return [p for name, fig in figs.items() if fig for p in save(fig, folder, name, crop=False)]
