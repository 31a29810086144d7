"""The figures' look: sans-serif type, 300 dpi PNG plus vector PDF (TrueType fonts embedded), the
Okabe–Ito colour-blind-safe palette. In the study's figures colour = platform, the same colour for a
platform in every figure (PLATFORM_COLORS; black for a quantity measured across platforms, e.g. a
gap), and an arm is told apart by its position, its marker and its line style (arm_styles), the same
arm the same marker and style in every figure that draws arms as lines (the training curves; up to
len(ARM_LINESTYLES) arms with distinct line styles). arm_colors (one colour per arm) is for the
experiments' figures, which compare arms on one platform.
Reference: docs/statistics.md "Report and figures".
"""

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # after matplotlib.use: no display needed

# Okabe & Ito (2008), without black (used for means) and yellow (too light on white paper).
PALETTE = ('#0072B2', '#D55E00', '#009E73', '#CC79A7', '#56B4E9', '#E69F00', '#999999', '#882255')
# Fixed colours of the platforms the project runs on; any other platform takes the next unused
# palette colour in sorted name order (platform_colors).
PLATFORM_COLORS = {'cpu': PALETTE[0], 'gpu': PALETTE[1], 'tpu': PALETTE[2]}
ACROSS_PLATFORMS = 'black'  # a quantity measured across platforms (a gap, a platform difference)
NO_PLATFORM = '#444444'  # runs that record no platform
# An arm's marker and line style; 'D' is left for estimates (forest plots, means).
ARM_MARKERS = ('o', 's', '^', 'v', 'P', 'X', '*', 'h', '<', '>')
ARM_LINESTYLES = (
  '-',
  '--',
  ':',
  '-.',
  (0, (6, 1.5)),
  (0, (3, 1, 1, 1, 1, 1)),
  (0, (1, 2.5)),
  (0, (7, 2, 1.5, 2)),
)  # eight distinct: one per arm of the digits study
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
  """{platform: colour}: PLATFORM_COLORS for cpu, gpu and tpu, the unused palette colours in sorted
  name order for any other, NO_PLATFORM for '' (so a platform has one colour in every figure)."""
  names = sorted(set(map(str, platforms)))
  spare = [c for c in PALETTE if c not in PLATFORM_COLORS.values()]
  others = [p for p in names if p and p not in PLATFORM_COLORS]
  out = {p: spare[others.index(p) % len(spare)] for p in others}
  out.update({p: PLATFORM_COLORS[p] for p in names if p in PLATFORM_COLORS})
  return {p: out.get(p, NO_PLATFORM) for p in names}


def arm_styles(arms):
  """{arm label: (marker, line style)} in the order given (the study's arm order, so every figure
  that is handed the same arms agrees): every arm its own marker (up to len(ARM_MARKERS) arms),
  line styles cycling."""
  arms = list(dict.fromkeys(arms))
  return {
    a: (ARM_MARKERS[i % len(ARM_MARKERS)], ARM_LINESTYLES[i % len(ARM_LINESTYLES)])
    for i, a in enumerate(arms)
  }


def save(fig, out_dir, name, crop=True):
  """Write `name`.pdf and `name`.png (300 dpi) into out_dir; returns the two paths. crop=False
  keeps the figure's own size (a figure laid out for a printed width), else it is cropped to
  what is drawn."""
  paths = [f'{out_dir}/{name}.pdf', f'{out_dir}/{name}.png']
  with matplotlib.rc_context({'savefig.bbox': 'tight' if crop else 'standard'}):
    for path in paths:
      fig.savefig(path)
  plt.close(fig)
  return paths
