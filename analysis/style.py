"""One presentation style for the study: figure look and arm colours, and the report tables.

Figures: sans-serif type, 300 dpi PNG plus vector PDF (TrueType fonts embedded), the Okabe–Ito
colour-blind-safe palette. In the study's figures colour = platform, the same colour for a platform
in every figure (PLATFORM_COLORS; black for a quantity measured across platforms, e.g. a gap), and
an arm is told apart by its position, its marker and its line style (arm_styles), the same arm the
same marker and style in every figure. arm_colors (one colour per arm) is for the experiments'
figures, which compare arms on one platform.
Tables: the statistics report as Markdown, LaTeX (booktabs) or CSV files.
"""

import math

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from analysis import inference, stats  # pylint: disable=wrong-import-position

# Okabe & Ito (2008), without black (used for means) and yellow (too light on white paper).
PALETTE = ('#0072B2', '#D55E00', '#009E73', '#CC79A7', '#56B4E9', '#E69F00', '#999999',
           '#882255')
# Fixed colours of the platforms the project runs on; any other platform takes the next unused
# palette colour in sorted name order (platform_colors).
PLATFORM_COLORS = {'cpu': PALETTE[0], 'gpu': PALETTE[1], 'tpu': PALETTE[2]}
ACROSS_PLATFORMS = 'black'  # a quantity measured across platforms (a gap, a platform difference)
NO_PLATFORM = '#444444'  # runs that record no platform
# An arm's marker and line style; 'D' is left for estimates (forest plots, means).
ARM_MARKERS = ('o', 's', '^', 'v', 'P', 'X', '*', 'h', '<', '>')
ARM_LINESTYLES = ('-', '--', ':', '-.')
WIDTH_IN = 6.5  # a full text width of a two-column-free paper, inches (the experiments' figures)
# The study's figures are drawn at their printed size (saved uncropped: save(..., crop=False)):
ONE_COLUMN_IN = 3.3  # one column of a two-column paper, inches
TWO_COLUMN_IN = 6.9  # both columns of a two-column paper, inches
RC = {
    'font.family': 'sans-serif',
    'font.sans-serif': ['DejaVu Sans', 'Arial', 'Helvetica'],
    'font.size': 8, 'axes.titlesize': 9, 'axes.labelsize': 8, 'legend.fontsize': 7,
    'xtick.labelsize': 7, 'ytick.labelsize': 7,
    'axes.spines.top': False, 'axes.spines.right': False, 'axes.linewidth': 0.6,
    'axes.grid': True, 'axes.grid.axis': 'y', 'grid.color': '#DDDDDD', 'grid.linewidth': 0.5,
    'lines.linewidth': 1.2, 'xtick.major.width': 0.6, 'ytick.major.width': 0.6,
    'legend.frameon': False, 'figure.dpi': 100, 'savefig.dpi': 300, 'savefig.bbox': 'tight',
    'savefig.pad_inches': 0.03, 'pdf.fonttype': 42, 'ps.fonttype': 42,
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
  return {a: (ARM_MARKERS[i % len(ARM_MARKERS)], ARM_LINESTYLES[i % len(ARM_LINESTYLES)])
          for i, a in enumerate(arms)}


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


def num(x, digits=2):
  """A table number: fixed digits, small p-values as '<0.001', missing as '–'."""
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '–'
  if isinstance(x, (bool,)) or not isinstance(x, (int, float)):
    return str(x)
  return f'{x:.{digits}f}'


def pval(p):
  """p-value text: 3 significant places, '<0.001' below."""
  if p is None or (isinstance(p, float) and math.isnan(p)):
    return '–'
  return '<0.001' if p < 0.001 else f'{p:.3f}'


def det_text(det, why):
  """'yes' / 'no (why)' / 'unknown (why)' for the arm table."""
  return 'yes' if det is True else f'{"no" if det is False else "unknown"} ({why})'


def display_arms(out):
  """The per-arm table as strings, for Markdown/LaTeX (with the short label when declared)."""
  unit = ' (%)' if out.scale == 100 else ''
  info = out.arm_info
  short = dict(zip(info['arm'], info['label'])) if info is not None else {}
  several = info is not None and info['platform'].nunique() > 1
  platform = dict(zip(info['arm'], info['platform'])) if several else {}
  rows = [{**({'platform': platform[r['arm']]} if several else {}),
           'arm': short.get(r['arm'], r['arm']), 'n': str(r['n']), 'runs': str(r['n_runs']),
           f'mean{unit}': num(r['mean']), 'sd': num(r['sd']),
           '95% CI': f'[{num(r["ci_low"])}, {num(r["ci_high"])}]', 'CI method': r['ci_method'],
           'within-seed sd': (f'{num(r["within_sd"])} (df {r["within_df"]})' if r['within_df']
                              else '–'),
           'deterministic': det_text(r['deterministic'], r['determinism']),
           **({'seeds': r['seeds']} if not short else {})}
          for _, r in out.arms.iterrows()]
  return rows


def display_pairs(pairs, unit):
  """A pair or contrast table as strings, for Markdown/LaTeX (p-values: raw (Holm)); Δ in `unit`."""
  both = lambda r, t: f'{pval(r[t + "_p"])} ({pval(r[t + "_p_holm"])})'
  eq = lambda r: ('yes' if r['equivalent'] else 'no') + (
      f' (raw: {"yes" if r["equivalent_raw"] else "no"})'
      if r['equivalent'] != r['equivalent_raw'] else '')
  rows = []
  for _, r in pairs.iterrows():
    rows.append({
        'A': r['arm_a'], 'B': r['arm_b'], 'verdict': r['verdict'],
        f'Δ A−B ({unit})': num(r['diff']),
        '95% CI': f'[{num(r["ci95_low"])}, {num(r["ci95_high"])}]',
        '90% CI': f'[{num(r["ci90_low"])}, {num(r["ci90_high"])}]',
        'equiv. (Holm TOST)': eq(r), 'TOST p': both(r, 'tost'),
        'Welch p': both(r, 'welch'), 'paired p': both(r, 'paired') if r['paired'] else '–',
        'rank test p (method)': (f"{r['rank_test']} {both(r, 'rank')}, "
                                 f"{r['signed_rank_method'] if r['paired'] else r['mw_method']}"),
        'effect size': (f"d_z {num(r['d_z'])}" if r['paired'] else f"Hedges' g {num(r['hedges_g'])}"),
        'seeds 80% (Δ/eq.)': f'{r["n80_diff"]}/{r["n80_equiv"]}'})
  return rows


def markdown(rows):
  """A Markdown table from a list of equal-keyed dicts of strings."""
  if not rows:
    return '(none)\n'
  cols = list(rows[0])
  esc = lambda s: str(s).replace('|', '\\|')
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '|'.join('---' for _ in cols) + '|']
  lines += ['| ' + ' | '.join(esc(r[c]) for c in cols) + ' |' for r in rows]
  return '\n'.join(lines) + '\n'


def tex(s):
  """Escape LaTeX specials in a cell."""
  table = {'\\': r'\textbackslash{}', '&': r'\&', '%': r'\%', '$': r'\$', '#': r'\#',
           '_': r'\_', '{': r'\{', '}': r'\}', '~': r'\textasciitilde{}', '^': r'\^{}',
           'Δ': r'$\Delta$', '−': '$-$', '<': r'$<$', '>': r'$>$', '–': '--', '±': r'$\pm$',
           '≥': r'$\geq$', '≤': r'$\leq$', 'α': r'$\alpha$'}
  return ''.join(table.get(ch, ch) for ch in str(s))


def numeric_cell(text):
  """Does a table cell hold a number or an interval (right-aligned in LaTeX)?"""
  return bool(text) and (text[0] in '+-−–[<' or text[0].isdigit())


def latex(rows, caption, label=None):
  """A booktabs LaTeX table (needs \\usepackage{booktabs}) from a list of dicts of strings;
  columns of numbers right-aligned, text left-aligned."""
  if not rows:
    return f'% {caption}: none\n'
  cols = list(rows[0])
  align = ''.join('r' if all(numeric_cell(str(r[c])) for r in rows) else 'l' for c in cols)
  body = [' & '.join(tex(r[c]) for c in cols) + r' \\' for r in rows]
  return '\n'.join([r'\begin{table}[t]', r'\centering', r'\small',
                    r'\begin{tabular}{' + align + '}', r'\toprule',
                    ' & '.join(tex(c) for c in cols) + r' \\', r'\midrule', *body,
                    r'\bottomrule', r'\end{tabular}', rf'\caption{{{tex(caption)}}}',
                    *([rf'\label{{{label}}}'] if label else []), r'\end{table}']) + '\n'


def captions(out, pairs):
  """(arms caption, caption of the judged `pairs` table) saying what the numbers are."""
  unit = out.unit
  per = 'seed (replicates of a seed averaged)' if out.seeded else 'run (no seed column)'
  arms = (f'{out.metric} per arm: n = number of {"seeds" if out.seeded else "runs"}, one '
          f'value per {per}; sd between them; 95% CI of the mean by the method named '
          f'(t-interval below n = {inference.BCA_MIN_N}, where the BCa bootstrap under-covers, and '
          f'from n = {inference.BCA_MAX_N:,}, where the two agree); within-seed sd: '
          f'spread of replicates of one seed (nondeterminism), pooled, with its df. '
          f'Arms by {", ".join(out.group_by)}.')
  pairs = (f'Δ = mean A − mean B in {unit} (over shared seeds when paired); 95% CI of the '
           f'difference test (paired t when paired, else Welch); 90% CI and TOST against the '
           f'margin ±{out.margin:g} {unit}; equivalent: Holm-adjusted TOST p < '
           f'{inference.ALPHA:g} (raw decision in brackets when it differs); p-values raw (Holm '
           f'over the {stats.family_size(pairs)} comparison(s) tested; identical arithmetic is not tested); '
           f'seeds (pairs when paired) for 80% power, α = {inference.ALPHA:g}, at Δ = margin / for '
           'equivalence.')
  return arms, pairs


def tables(out, pairs):
  """[(title, rows)] of the report's last tables: the design of each judged pair, replicates,
  exclusions."""
  design = [{'A': r['arm_a'], 'B': r['arm_b'], 'design': r['design']} for _, r in pairs.iterrows()]
  reps = [{'arm': r['arm'], 'seed': str(r['seed']), 'runs': str(r['n_runs']), 'values': r['values'],
           'mean used': num(r['mean']), 'identical': 'yes' if r['identical'] else 'no'}
          for _, r in out.replicates.iterrows()]
  exc = [{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()]
  return [('Design of each comparison', design),
          ('Repeated seeds (replicates averaged; their spread is the within-seed sd)', reps),
          ('Runs excluded', exc)]
