"""Forest plots of the study, one column wide (style.ONE_COLUMN_IN) and drawn at their printed size,
as PDF and 300-dpi PNG in analysis/style.py's style: intervals against a zero line, the equivalence
margin (dashed) and the noise floor (shaded: the 95% half-width of a difference of two noise-arm
means, analysis.attribution.noise_floor).

  plot            attribution_forest: each factor term's estimate ± 95% CI (analysis.attribution)
  plot_gap        gap_decomposition: native gap = numerics part + residual, each ± 95% CI (thin)
                  and, for the gap and the residual, the 90% CI of their TOST (thick)
  plot_contrasts  contrasts: each declared contrast (arm − reference arm, per platform) ± 95% CI
                  (thin) and 90% CI (thick), one marker colour per platform
"""

import numpy as np

from analysis import style

plt = style.plt
NAME = 'attribution_forest'
GAP_NAME = 'gap_decomposition'
CONTRASTS_NAME = 'contrasts'
ROW_IN = 0.2  # height of one row, inches
GREY = '#999999'


def frame_height(rows, extra=0.9, row=ROW_IN):
  """Figure height (inches) for `rows` rows of `row` inches plus legend and axis label."""
  return extra + row * max(rows, 1)


def draw_limits(ax, margin, half, unit, noise_label=None, margin_label=True):
  """Zero line, ±margin (dashed) and the noise band ±half (shaded), labelled for the legend
  unless noise_label / margin_label is False."""
  if half is not None and np.isfinite(half) and half > 0:
    ax.axvspan(-half, half, color=GREY, alpha=0.15, linewidth=0,
               label=(noise_label or f'noise floor ±{half:.2f} {unit}') if noise_label is not False
               else None)
  if margin:
    for sign in (-1, 1):
      ax.axvline(sign * margin, color='black', linestyle='--', linewidth=0.7,
                 label=f'margin ±{margin:g} {unit}' if sign > 0 and margin_label else None)
  ax.axvline(0, color='#555555', linewidth=0.6)


def draw_interval(ax, y, est, ci95, ci90=None, color='#0072B2', filled=True, labels=(None,) * 3):
  """A marker at `est`, a thin 95% CI line and, when given, a thick 90% CI line; `labels`:
  legend labels of the marker, the 95% line and the 90% line (None: unlabelled)."""
  ax.plot(ci95, [y, y], color=color, linewidth=0.8, solid_capstyle='butt', label=labels[1])
  if ci90 is not None and np.isfinite(ci90[0]):
    ax.plot(ci90, [y, y], color=color, linewidth=2.4, alpha=0.55, solid_capstyle='butt',
            label=labels[2])
  ax.plot([est], [y], 'D', color=color, markersize=3.2, markerfacecolor=color if filled else 'white',
          markeredgewidth=0.8, label=labels[0], zorder=3)


def finish(ax, labels, xlabel, ncol=2):
  """Row labels top to bottom, x label, the legend above the axes inside the figure, x grid."""
  n = len(labels)
  ax.set_yticks(np.arange(n)[::-1], labels)
  ax.set_ylim(-0.6, n - 0.4)
  ax.grid(axis='y', visible=False)
  ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
  ax.tick_params(axis='y', length=0)
  ax.set_xlabel(xlabel)
  ax.figure.legend(*ax.get_legend_handles_labels(), loc='outside upper center', ncol=ncol,
                   handlelength=1.6, columnspacing=1.0, fontsize=6.5)


def plot(out, out_dir, name=NAME):
  """attribution_forest: out['terms'] top to bottom in table order; returns the two paths."""
  style.apply()
  terms, labels = out['terms'], out.get('labels') or {}
  fig, ax = plt.subplots(figsize=(style.ONE_COLUMN_IN, frame_height(len(terms))), layout='constrained')
  draw_limits(ax, out['margin'], out['noise']['half'], out['unit'])
  for y, r in zip(np.arange(len(terms))[::-1], terms.itertuples()):
    draw_interval(ax, y, r.estimate, [r.ci_low, r.ci_high],
                  labels=('estimate', '95% CI', None) if y == len(terms) - 1 else (None,) * 3)
  finish(ax, [labels.get(t, t) for t in terms['term']],
         f'difference from the reference level ({out["unit"]})')
  return style.save(fig, out_dir, name, crop=False)


def gap_labels(d):
  a, b = d['profiles']
  return [f'native gap\n{d["gap"].replace(" - ", " − ")}', f'= numerics part\n{a} − {b}',
          '+ platform residual']


def plot_gap(out, out_dir, name=GAP_NAME):
  """gap_decomposition (draw_gap) as PDF and PNG; None without a gap."""
  fig = draw_gap(out)
  return None if fig is None else style.save(fig, out_dir, name, crop=False)


def draw_gap(out):
  """The figure: per gap (out['decomposition']) its three parts; None without a gap."""
  parts = out.get('decomposition') or []
  if not parts:
    return None
  style.apply()
  height = frame_height(3 * len(parts), extra=1.0, row=0.32)
  fig, ax = plt.subplots(figsize=(style.ONE_COLUMN_IN, height), layout='constrained')
  draw_limits(ax, parts[0]['margin'], out['noise']['half'], out['unit'])
  labels, y = [], 3 * len(parts) - 1
  for d in parts:
    for key, label in zip('GNR', gap_labels(d)):
      ci90 = [d[f'{key}_ci90_low'], d[f'{key}_ci90_high']] if key != 'N' else None
      draw_interval(ax, y, d[key], [d[f'{key}_ci_low'], d[f'{key}_ci_high']], ci90,
                    color=style.PALETTE[0],
                    labels=('estimate', '95% CI', '90% CI (TOST)') if not labels else (None,) * 3)
      labels.append(label)
      y -= 1
  finish(ax, labels, f'difference ({out["unit"]})', ncol=3)
  ax.set_title(' · '.join(f'{d["gap"].replace(" - ", " − ")}: {d["verdict"]} at ±{d["margin"]:g} '
                          f'{out["unit"]}' for d in parts), loc='left', fontsize=7.5, pad=3)
  return fig


def plot_contrasts(table, noise, margin, unit, out_dir, name=CONTRASTS_NAME):
  """contrasts (draw_contrasts) as PDF and PNG; None without contrasts."""
  fig = draw_contrasts(table, noise, margin, unit)
  return None if fig is None else style.save(fig, out_dir, name, crop=False)


def draw_contrasts(table, noise, margin, unit):
  """The figure: one row per contrast label (analysis/contrasts.py table), one marker per
  platform (offset within the row); `noise` {platform: half-width}. None without contrasts."""
  if table is None or table.empty:
    return None
  style.apply()
  rows = list(dict.fromkeys(table['label']))
  platforms = list(dict.fromkeys(table['platform']))
  colors = style.platform_colors(platforms)
  fig, ax = plt.subplots(figsize=(style.ONE_COLUMN_IN, frame_height(len(rows), extra=1.1)),
                         layout='constrained')
  floors = [p for p in platforms if noise.get(p)]
  values = '/'.join(f'±{noise[p]:.2f}' for p in floors)
  which = f' ({"/".join(floors)})' if len(platforms) > 1 else ''
  for i, p in enumerate(platforms):  # nested grey bands: darker inside every platform's floor
    draw_limits(ax, margin, noise.get(p), unit, f'noise floor {values} {unit}{which}' if p == (
        floors or [None])[0] else False, margin_label=i == 0)
  step = 0.32 / max(len(platforms) - 1, 1)
  offsets = {p: 0.16 - i * step if len(platforms) > 1 else 0.0 for i, p in enumerate(platforms)}
  seen = set()
  for r in table.itertuples():
    y = len(rows) - 1 - rows.index(r.label) + offsets[r.platform]
    marker = r.platform if len(platforms) > 1 else 'Δ'
    draw_interval(ax, y, r.diff, [r.ci95_low, r.ci95_high], [r.ci90_low, r.ci90_high],
                  color=colors[r.platform], filled=r.paired,
                  labels=(None if marker in seen else marker,
                          *(('95% CI', '90% CI') if not seen else (None, None))))
    seen.add(marker)
  finish(ax, rows, f'arm − reference arm ({unit})', ncol=2)
  return fig
