"""The report's tables as text: numbers and p-values as printed, the per-arm and per-pair tables,
and Markdown, LaTeX (booktabs) and CSV renderings of them.
Reference: docs/statistics.md "Report and figures".
"""

import math

from analysis import stats


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
  short = dict(zip(info['arm'], info['label'], strict=True)) if info is not None else {}
  several = info is not None and info['platform'].nunique() > 1
  platform = dict(zip(info['arm'], info['platform'], strict=True)) if several else {}
  rows = [
    {
      **({'platform': platform[r['arm']]} if several else {}),
      'arm': short.get(r['arm'], r['arm']),
      'n': str(r['n']),
      'runs': str(r['n_runs']),
      f'mean{unit}': num(r['mean']),
      'sd': num(r['sd']),
      '95% CI': f'[{num(r["ci_low"])}, {num(r["ci_high"])}]',
      'CI method': r['ci_method'],
      'within-seed sd': (f'{num(r["within_sd"])} (df {r["within_df"]})' if r['within_df'] else '–'),
      'deterministic': det_text(r['deterministic'], r['determinism']),
      **({'seeds': r['seeds']} if not short else {}),
    }
    for _, r in out.arms.iterrows()
  ]
  return rows


def display_pairs(pairs, unit):
  """A pair or contrast table as strings, for Markdown/LaTeX (p-values: raw (Holm)); Δ in `unit`."""

  def both(r, t):
    return f'{pval(r[t + "_p"])} ({pval(r[t + "_p_holm"])})'

  def eq(r):
    return ('yes' if r['equivalent'] else 'no') + (
      f' (raw: {"yes" if r["equivalent_raw"] else "no"})'
      if r['equivalent'] != r['equivalent_raw']
      else ''
    )

  rows = []
  for _, r in pairs.iterrows():
    if r['verdict'] == 'identical arithmetic':  # reported, not tested: no test column filled
      rows.append(untested_row(r, unit))
      continue
    rows.append(
      {
        'A': r['arm_a'],
        'B': r['arm_b'],
        'verdict': r['verdict'],
        f'Δ A−B ({unit})': num(r['diff']),
        '95% CI': f'[{num(r["ci95_low"])}, {num(r["ci95_high"])}]',
        '90% CI': f'[{num(r["ci90_low"])}, {num(r["ci90_high"])}]',
        'equiv. (Holm TOST)': eq(r),
        'TOST p': both(r, 'tost'),
        'Welch p': both(r, 'welch'),
        'paired p': both(r, 'paired') if r['paired'] else '–',
        'rank test p (method)': (
          f'{r["rank_test"]} {both(r, "rank")}, '
          f'{r["signed_rank_method"] if r["paired"] else r["mw_method"]}'
        ),
        'effect size': (
          f'd_z {num(r["d_z"])}' if r['paired'] else f"Hedges' g {num(r['hedges_g'])}"
        ),
        'seeds 80% (Δ/eq.)': f'{r["n80_diff"]}/{r["n80_equiv"]}',
      }
    )
  return rows


def untested_row(r, unit):
  """display_pairs' row of an identical-arithmetic pair: Δ and its CIs, every test 'not tested'."""
  return {
    'A': r['arm_a'],
    'B': r['arm_b'],
    'verdict': r['verdict'],
    f'Δ A−B ({unit})': num(r['diff']),
    '95% CI': f'[{num(r["ci95_low"])}, {num(r["ci95_high"])}]',
    '90% CI': f'[{num(r["ci90_low"])}, {num(r["ci90_high"])}]',
    'equiv. (Holm TOST)': 'not tested',
    'TOST p': 'not tested',
    'Welch p': 'not tested',
    'paired p': 'not tested',
    'rank test p (method)': 'not tested',
    'effect size': 'not tested',
    'seeds 80% (Δ/eq.)': '–',
  }


def markdown(rows):
  """A Markdown table from a list of equal-keyed dicts of strings."""
  if not rows:
    return '(none)\n'
  cols = list(rows[0])

  def esc(s):
    return str(s).replace('|', '\\|')

  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '|'.join('---' for _ in cols) + '|']
  lines += ['| ' + ' | '.join(esc(r[c]) for c in cols) + ' |' for r in rows]
  return '\n'.join(lines) + '\n'


def tex(s):
  """Escape LaTeX specials in a cell."""
  table = {
    '\\': r'\textbackslash{}',
    '&': r'\&',
    '%': r'\%',
    '$': r'\$',
    '#': r'\#',
    '_': r'\_',
    '{': r'\{',
    '}': r'\}',
    '~': r'\textasciitilde{}',
    '^': r'\^{}',
    'Δ': r'$\Delta$',
    '−': '$-$',
    '<': r'$<$',
    '>': r'$>$',
    '–': '--',
    '±': r'$\pm$',
    '≥': r'$\geq$',
    '≤': r'$\leq$',
    'α': r'$\alpha$',
  }
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
  return (
    '\n'.join(
      [
        r'\begin{table}[t]',
        r'\centering',
        r'\small',
        r'\begin{tabular}{' + align + '}',
        r'\toprule',
        ' & '.join(tex(c) for c in cols) + r' \\',
        r'\midrule',
        *body,
        r'\bottomrule',
        r'\end{tabular}',
        rf'\caption{{{tex(caption)}}}',
        *([rf'\label{{{label}}}'] if label else []),
        r'\end{table}',
      ]
    )
    + '\n'
  )


def captions(out, pairs):
  """(arms caption, caption of the judged `pairs` table) saying what the numbers are."""
  unit = out.unit
  per = 'seed (replicates of a seed averaged)' if out.seeded else 'run (no seed column)'
  arms = (
    f'{out.metric} per arm: n = number of {"seeds" if out.seeded else "runs"}, one '
    f'value per {per}; sd between them; 95% CI of the mean by the method named '
    f'(t-interval below n = {stats.BCA_MIN_N}, where the BCa bootstrap under-covers, and '
    f'from n = {stats.BCA_MAX_N:,}, where the two agree); within-seed sd: '
    f'spread of replicates of one seed (nondeterminism), pooled, with its df. '
    f'Arms by {", ".join(out.group_by)}.'
  )
  pairs = (
    f'Δ = mean A − mean B in {unit} (over shared seeds when paired); 95% CI of the '
    f'difference test (paired t when paired, else Welch); 90% CI and TOST against the '
    f'margin ±{out.margin:g} {unit}; equivalent: Holm-adjusted TOST p < '
    f'{stats.ALPHA:g} (raw decision in brackets when it differs); p-values raw (Holm '
    f'over the {stats.family_size(pairs)} comparison(s) tested; '
    'identical arithmetic is not tested); '
    f'seeds (pairs when paired) for 80% power, α = {stats.ALPHA:g}, at Δ = margin / for '
    'equivalence.'
  )
  return arms, pairs


def detail_tables(out, pairs):
  """[(title, rows)] of the report's last tables: the design of each judged pair, replicates,
  exclusions."""
  design = [{'A': r['arm_a'], 'B': r['arm_b'], 'design': r['design']} for _, r in pairs.iterrows()]
  reps = [
    {
      'arm': r['arm'],
      'seed': str(r['seed']),
      'runs': str(r['n_runs']),
      'values': r['values'],
      'mean used': num(r['mean']),
      'identical': 'yes' if r['identical'] else 'no',
    }
    for _, r in out.replicates.iterrows()
  ]
  exc = [{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()]
  return [
    ('Design of each comparison', design),
    ('Repeated seeds (replicates averaged; their spread is the within-seed sd)', reps),
    ('Runs excluded', exc),
  ]
