"""The training curves' legend (analysis/figures/study_figures.py draw_training_curves): the drawn
lines in arm order, or, where an arm label occurs on several platforms, one key per arm (its
marker and line style) and one per platform (its colour).
"""

from matplotlib.lines import Line2D


def crosses_platforms(place):
  """Does an arm label occur on more than one platform ({arm: (label, platform)})?"""
  per_label = {}
  for cat, platform in place.values():
    per_label.setdefault(cat, set()).add(platform)
  return any(len(p) > 1 for p in per_label.values())


def drawn_entries(axes, rank):
  """(handles, labels) of the drawn lines, in arm order (`rank` {label: position})."""
  handles, labels = next(a for a in axes if a.get_lines()).get_legend_handles_labels()
  order = sorted(range(len(labels)), key=lambda i: rank[labels[i]])
  return [handles[i] for i in order], [labels[i] for i in order]


def legend_entries(categories, place, same, colors, styles):
  """(handles, labels) when an arm label occurs on several platforms: one key per arm (dark grey,
  its marker and line style; '= X on P' where it is identical to arm X on platform P) and one per
  platform (its colour)."""
  note = {}
  for arm, other in same.items():
    note.setdefault(place[arm][0], []).append(f'= {place[other][0]} on {place[arm][1]}')
  handles = [
    Line2D(
      [],
      [],
      color='#333333',
      linestyle=styles[c][1],
      marker=styles[c][0],
      markersize=3.2,
      markerfacecolor='none',
      markeredgewidth=0.7,
      linewidth=1.0,
    )
    for c in categories
  ]
  labels = [c + (f' ({", ".join(note[c])})' if c in note else '') for c in categories]
  platforms = sorted(colors)
  under = {p: len(platforms) - 1 - i for i, p in enumerate(platforms)}  # as band() draws them
  handles += [Line2D([], [], color=colors[p], linewidth=1.0 + 1.0 * under[p]) for p in platforms]
  return handles, labels + [p + (' (wider: drawn beneath)' if under[p] else '') for p in platforms]
