"""Forest plots of the study, one column wide (style.ONE_COLUMN_IN) and drawn at their printed
size (analysis/catalogue.py lists them): intervals against a zero line, the equivalence margin
(dashed, black) and each platform's noise floor (a band in its colour: the 95% half-width of the
paired mean difference noise arm − the arm it perturbs, analysis.numbers.attribution.noise_floor).
Colour = platform (black: measured across platforms).

  attribution_forest  per platform gap every component of its decomposition (COMPONENT_ROWS,
                      analysis/numbers/gap.py) ± 95% t-CI over seeds, then the main effects of the
                      other factors (the platform term only where no gap is decomposed: it
                      averages different arithmetic)
  gap_decomposition   per platform pair G = fid_A − fid_B + N + P, each part as it enters the sum
                      (SUM_ROWS) ± 95% CI, the residual R = G − N; G and R with their TOST's 90% CI
  draw_contrasts      each contrast (arm − reference, per platform) ± 95% CI (thin) and 90% CI
                      (thick), the estimate a 'D' (hollow: unpaired)
Reference: docs/statistics.md "Report and figures".
"""

import numpy as np
from matplotlib.colors import to_rgba

from analysis.figures import naming, style

plt = style.plt
ROW_IN = 0.2  # height of one row, inches
PLATFORM_FACTOR = 'platform'
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
ON_A, ON_B = ('fid_A', 'N_A'), ('fid_B', 'N_B')  # components measured on one platform


def frame_height(rows, extra=0.9, row=ROW_IN):
  """Figure height (inches) for `rows` rows of `row` inches plus legend and axis label."""
  return extra + row * max(rows, 1)


def floors_of(noise):
  """{platform: 95% half-width} of a noise dict
  ({platform: analysis.numbers.attribution.noise_floor})."""
  return {p: f.half for p, f in (noise or {}).items() if f and np.isfinite(f.half)}


def draw_limits(ax, margin, floors, unit, label=True):
  """Zero line, ±margin (dashed) and one noise band ±half per platform ({platform: half}) in the
  platform's colour, widest first, each with its own legend label unless `label` is False."""
  colors = style.platform_colors(floors)
  for p, half in sorted(floors.items(), key=lambda item: -item[1]):
    if half > 0:
      name = f'noise floor {p} ±{half:.2f} {unit}' if p else f'noise floor ±{half:.2f} {unit}'
      ax.axvspan(
        -half,
        half,
        facecolor=to_rgba(colors[p], 0.1),
        linewidth=0.7,
        edgecolor=to_rgba(colors[p], 0.8),
        label=name if label else None,
      )
  if margin:
    for sign in (-1, 1):
      ax.axvline(
        sign * margin,
        color='black',
        linestyle='--',
        linewidth=0.7,
        label=f'margin ±{margin:g} {unit}' if sign > 0 and label else None,
      )
  ax.axvline(0, color='#555555', linewidth=0.6)


def draw_interval(
  ax,
  y,
  est,
  ci95,
  ci90=None,
  color=style.ACROSS_PLATFORMS,
  filled=True,
  labels=(None,) * 3,
  marker='D',
):
  """A marker at `est`, a thin 95% CI line and, when given, a thick 90% CI line; `labels`:
  legend labels of the marker, the 95% line and the 90% line (None: unlabelled)."""
  ax.plot(ci95, [y, y], color=color, linewidth=0.8, solid_capstyle='butt', label=labels[1])
  if ci90 is not None and np.isfinite(ci90[0]):
    ax.plot(
      ci90, [y, y], color=color, linewidth=2.4, alpha=0.55, solid_capstyle='butt', label=labels[2]
    )
  ax.plot(
    [est],
    [y],
    marker,
    color=color,
    markersize=3.4,
    markerfacecolor=color if filled else 'white',
    markeredgewidth=0.8,
    label=labels[0],
    zorder=3,
  )


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


def caption(fig, text):
  """The study's context line (naming.context) as a caption under the axes, left-aligned (the
  legend takes the top of a one-column figure; constrained layout makes room for both)."""
  fig.supxlabel(text, x=0.01, ha='left', fontsize=6, color='#444444')


def legend_above(fig, handles, labels, ncol=2):
  """The figure's legend above the axes, inside the figure (none without entries)."""
  if handles:
    fig.legend(
      handles,
      labels,
      loc='outside upper center',
      ncol=ncol,
      handlelength=1.6,
      columnspacing=1.0,
      fontsize=6.5,
    )


def component_color(key, platforms):
  """The platform's colour for a component measured on one platform, else ACROSS_PLATFORMS."""
  colors = style.platform_colors(platforms)
  return (
    colors[platforms[0]]
    if key in ON_A
    else colors[platforms[1]]
    if key in ON_B
    else style.ACROSS_PLATFORMS
  )


def gap_rows(out):
  """[(title, [(label, estimate, ci95, None, colour, note)])] of each gap in out.gap
  (COMPONENT_ROWS order), [] without a decomposition."""
  table, groups = out.gap, []
  for d in out.decomposition or []:
    (a, b), (ea, eb) = d.platforms, d.profiles
    rows = table[table['gap'] == d.gap].set_index('key')
    title = f'gap {a} − {b}, {d.seeds} seeds\ne_A = {ea}, e_B = {eb}'
    groups.append(
      (
        title,
        [
          (
            label.format(a=a, b=b),
            rows.loc[k, 'estimate'],
            [rows.loc[k, 'ci_low'], rows.loc[k, 'ci_high']],
            None,
            component_color(k, (a, b)),
            rows.loc[k, 'note'],
          )
          for k, label in COMPONENT_ROWS
          if k in rows.index
        ],
      )
    )
  return groups


def platform_term(term):
  """Does a model term (factor=level, or an interaction a:b) involve the platform factor?"""
  return any(
    part.partition('=')[0].rsplit('.', 1)[-1] == PLATFORM_FACTOR for part in term.split(':')
  )


def effect_rows(out):
  """(title, rows) of the model's main-effect terms: without the platform terms where the gap is
  decomposed, else with them labelled as the mean over every arm."""
  labels, decomposed = out.labels or {}, bool(out.decomposition)
  rows = []
  for r in out.terms.itertuples():
    if platform_term(r.term):
      if decomposed:
        continue
      label = f'{labels.get(r.term, r.term)}, mean over all arms'
    else:
      label = labels.get(r.term, r.term)
    rows.append((label, r.estimate, [r.ci_low, r.ci_high], None, style.ACROSS_PLATFORMS, ''))
  title = (
    'main effects of the other factors\n(additive model over every arm)'
    if decomposed
    else 'main effects (additive model)'
  )
  return title, rows


def draw_rows(ax, rows, labels=(None,) * 3, xlabel=None):
  """One interval per row (label, estimate, ci95, ci90 or None, colour, note) top to bottom,
  'not estimable' where noted; `labels`: the legend labels of the first row's marker, 95% and
  90% lines."""
  for y, (_, est, ci, ci90, color, note) in zip(np.arange(len(rows))[::-1], rows, strict=True):
    if note:
      ax.text(0, y, 'not estimable', ha='center', va='center', fontsize=6, color='#777777')
      continue
    draw_interval(
      ax, y, est, ci, ci90, color=color, labels=labels if y == len(rows) - 1 else (None,) * 3
    )
  rows_axis(ax, [r[0] for r in rows], xlabel)


def gap_platforms(out):
  """The platforms of every decomposed gap, sorted."""
  return sorted({p for d in out.decomposition or [] for p in d.platforms})


def estimate_key(color):
  """A legend key drawn as an estimate is: its 'D' marker on its 95% CI line, in `color`."""
  return plt.Line2D([], [], color=color, marker='D', markersize=3.4, linewidth=0.8)


def platform_keys(platforms, across=True, prefix='on '):
  """Legend keys: an estimate in each platform's colour ('on <platform>') and, with `across`, a
  black one for what is measured across platforms."""
  colors = style.platform_colors(platforms)
  keys = [(estimate_key(colors[p]), f'{prefix}{p}') for p in platforms]
  if across:
    keys.append((estimate_key(style.ACROSS_PLATFORMS), 'across platforms'))
  return keys


def neutral_keys(handles, labels, platforms):
  """The legend's (handles, labels) with the interval keys in dark grey (an interval of any
  platform); each platform's key is the marker as drawn (its colour, filled or hollow)."""
  out = []
  for h, label in zip(handles, labels, strict=True):
    if label.startswith(('95% CI', '90% CI')):
      h = plt.Line2D([], [], color='#333333', linewidth=h.get_linewidth(), alpha=h.get_alpha())
    out.append(h)
  return out, labels


def draw_forest(out):
  """The attribution forest (module doc): a panel per gap and one of main effects."""
  style.apply()
  groups = [g for g in [*gap_rows(out), effect_rows(out)] if g[1]]
  sizes = [len(rows) + 2.2 for _, rows in groups]  # rows plus the panel's title
  fig, axes = plt.subplots(
    len(groups),
    1,
    sharex=True,
    height_ratios=sizes,
    squeeze=False,
    figsize=(style.ONE_COLUMN_IN, frame_height(sum(sizes), extra=1.0)),
    layout='constrained',
  )
  floors = floors_of(out.noise)
  for i, (ax, (title, rows)) in enumerate(zip(axes[:, 0], groups, strict=True)):
    draw_limits(ax, out.margin, floors, out.unit, label=i == 0)
    draw_rows(ax, rows)
    ax.set_title(title, loc='left', fontsize=6.5, pad=3)
  axes[-1, 0].set_xlabel(f'estimate ± 95% CI ({out.unit})')
  handles, labels = axes[0, 0].get_legend_handles_labels()
  keys = platform_keys(gap_platforms(out)) if out.decomposition else []
  legend_above(fig, handles + [k for k, _ in keys], labels + [t for _, t in keys])
  return fig


def attribution_forest(given, out_dir, name):
  """draw_forest of `given.attribution` as NAME.pdf and .png (analysis/catalogue.py Figure); []
  without an attribution."""
  att = given.attribution
  return [] if att is None else style.save(draw_forest(att), out_dir, name, crop=False)


def sum_rows(out, d):
  """[(label, value, ci95, ci90, colour, note)] (draw_rows) of one gap's SUM_ROWS, each part as
  it enters G = fid_A − fid_B + N + P (fid_B negated, its CI flipped)."""
  a, b = d.platforms
  rows = out.gap[out.gap['gap'] == d.gap].set_index('key')
  out_rows = []
  for key, sign, label in SUM_ROWS:
    r = rows.loc[key]
    ci = sorted([sign * r['ci_low'], sign * r['ci_high']])
    ci90 = [r['ci90_low'], r['ci90_high']] if key in ('G', 'R') else None
    text = label.format(a=a, b=b) + (f':\n{verdict_line(d, out.unit)}' if key == 'G' else '')
    out_rows.append((text, sign * r['estimate'], ci, ci90, component_color(key, (a, b)), r['note']))
  return out_rows


def gap_decomposition(given, out_dir, name):
  """draw_gap of `given.attribution` as NAME.pdf and .png, subtitled with the study's context
  when `given.result` is there; [] without a gap."""
  att = given.attribution
  context = naming.context(given.result, 68) if given.result is not None else None
  fig = draw_gap(att, context) if att is not None else None
  return [] if fig is None else style.save(fig, out_dir, name, crop=False)


def draw_gap(out, context=None):
  """The figure: per gap (out.decomposition) G and its parts (SUM_ROWS), the x label the identity
  G = fid_A − fid_B + N + P; `context` (naming.context) as its subtitle; None without a gap."""
  parts = out.decomposition or []
  if not parts:
    return None
  style.apply()
  rows = [row for d in parts for row in sum_rows(out, d)]
  extra = 1.25 + (0.12 * (context.count('\n') + 1) if context else 0)
  fig, ax = plt.subplots(
    figsize=(style.ONE_COLUMN_IN, frame_height(len(rows), extra=extra, row=0.27)),
    layout='constrained',
  )
  if context:
    caption(fig, context)
  draw_limits(ax, parts[0].margin, floors_of(out.noise), out.unit)
  draw_rows(ax, rows, (None, '95% CI', '90% CI (TOST)'))
  ax.set_xlabel(
    f'each part as it enters the gap ({out.unit}):\nG = fid_A − fid_B + N + P', loc='right'
  )  # under the axes, not past the figure's edge
  for k in range(1, len(rows)):  # a rule above each residual row and between gaps
    if rows[k][0].startswith('residual') or rows[k][0].startswith('native gap'):
      ax.axhline(len(rows) - k - 0.5, color='#BBBBBB', linewidth=0.5)
  handles, labels = ax.get_legend_handles_labels()
  keys = platform_keys(gap_platforms(out))
  legend_above(fig, handles + [k for k, _ in keys], labels + [t for _, t in keys])
  return fig


def verdict_line(d, unit):
  """'<verdict> at ±m unit': the second line of a pair's gap row (its open part is in the
  report)."""
  return f'{d.verdict} at ±{d.margin:g} {unit}' if d.margin else d.verdict


def draw_contrasts(table, noise, margin, unit, context=None):
  """The figure: one row per contrast label (analysis/numbers/contrasts.py table), one interval per
  platform (offset within the row, the platform's colour, the estimate's 'D' marker, hollow:
  unpaired; each legend key drawn the same way); `noise` {platform: half-width}, one band and
  legend key per platform; `context` (naming.context) as its subtitle. None without contrasts."""
  if table is None or table.empty:
    return None
  style.apply()
  rows = list(dict.fromkeys(table['label']))
  platforms = list(dict.fromkeys(table['platform']))
  colors = style.platform_colors(platforms)
  extra = 1.1 + (0.12 * (context.count('\n') + 1) if context else 0)
  fig, ax = plt.subplots(
    figsize=(style.ONE_COLUMN_IN, frame_height(len(rows), extra=extra)), layout='constrained'
  )
  if context:
    caption(fig, context)
  draw_limits(ax, margin, {p: h for p, h in noise.items() if h}, unit)
  step = 0.32 / max(len(platforms) - 1, 1)
  offsets = {p: 0.16 - i * step if len(platforms) > 1 else 0.0 for i, p in enumerate(platforms)}
  seen = set()
  for r in table.itertuples():
    y = len(rows) - 1 - rows.index(r.label) + offsets[r.platform]
    key = r.platform if len(platforms) > 1 else 'Δ'
    draw_interval(
      ax,
      y,
      r.diff,
      [r.ci95_low, r.ci95_high],
      [r.ci90_low, r.ci90_high],
      color=colors[r.platform],
      filled=r.paired,
      marker='D',
      labels=(None if key in seen else key, *(('95% CI', '90% CI') if not seen else (None, None))),
    )
    seen.add(key)
  rows_axis(ax, rows, f'arm − reference arm ({unit})')
  legend_above(fig, *neutral_keys(*ax.get_legend_handles_labels(), platforms))
  return fig
