"""The report's answer in one sentence, first on its first page, for any study (one platform too):
the question's platform pair and its verdict, which numerics settings changed the metric (by the
contrasts' verdicts against the margin), and by how much they changed the model (the churn of each
setting against the churn between two seeds of one arm). Numbers and verdicts come from
analysis/numbers (stats.judge, gap_verdict, agreement.against_seeds); nothing is judged
here.
Reference: docs/statistics.md "Report and figures".
"""

from analysis import agreement, stats
from analysis.words.attribution_text import interval, signed


def row_name(r, several):
  """'bf16 activations' (or 'gpu: bf16 activations' with several platforms; 'A − B' unlabelled)."""
  name = (
    r['label'] if 'label' in r and isinstance(r['label'], str) else f'{r["arm_a"]} − {r["arm_b"]}'
  )
  return f'{r["platform"]}: {name}' if several and r.get('platform') else name


def listed(names, most=4):
  """'a, b and c' ('a, b, c, d and 3 more' beyond `most`)."""
  names = list(names)
  if len(names) > most:
    return ', '.join(names[:most]) + f' and {len(names) - most} more'
  return names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]


def pairs_clause(out):
  """Without declared contrasts: how the pairs of arms came out, counted (their names are the
  report's tables)."""
  seen = out.pairs['verdict'].value_counts()
  counts = ', '.join(f'{seen[v]} {v}' for v in stats.VERDICTS if v in seen)
  metric = out.metric.rsplit('.', 1)[-1].replace('_', ' ')
  return (
    f'{len(out.pairs)} pairs of arms compared on {metric} (no declared contrasts, Holm over '
    f'{stats.family_size(out.pairs)}): {counts}'
  )


def settings_clause(out):
  """Which settings changed the metric, by the contrasts' verdicts (counted for undeclared pairs);
  '' without contrasts."""
  table = out.contrasts if out.contrasts is not None else out.pairs
  if table is None or table.empty:
    return ''
  if out.contrasts is None:
    return pairs_clause(out)
  several = 'platform' in table and table['platform'].nunique() > 1
  by = {v: [r for _, r in table.iterrows() if r['verdict'] == v] for v in set(table['verdict'])}
  metric = out.metric.rsplit('.', 1)[-1].replace('_', ' ')
  m, unit = f'±{out.margin:g} {out.unit}', out.unit

  def show(rows):
    return listed(
      f'{row_name(r, several)} '
      f'({signed(r["diff"])} {interval(r["ci95_low"], r["ci95_high"])} {unit})'
      for r in rows
    )

  parts = []
  if by.get('different'):
    parts.append(f'{show(by["different"])} changed {metric} (a difference shown, not within {m})')
  if by.get('within margin'):
    parts.append(f'{show(by["within margin"])} changed it, by less than the margin {m}')
  if by.get('inconclusive'):
    parts.append(f'{listed(row_name(r, several) for r in by["inconclusive"])} are undecided')
  tested = len(table) - len(by.get('identical arithmetic', []))
  if by.get('equivalent'):
    lead = 'no numerics setting changed ' + metric if len(parts) == 0 else 'the others did not'
    parts.append(f'{lead} beyond {m} ({len(by["equivalent"])} of {tested} tested equivalent)')
  if by.get('identical arithmetic'):
    same = listed(row_name(r, several) for r in by['identical arithmetic'])
    parts.append(
      f"{same} {'is' if len(by['identical arithmetic']) == 1 else 'are'} the reference's "
      'own arithmetic (exactly 0, not tested)'
    )
  return '; '.join(parts)


def churn_clause(out):
  """By how much the settings changed the model: their churn against two seeds'; '' without
  predictions."""
  table = out.agreement.table if out.agreement else None
  read = agreement.against_seeds(table) if table is not None and not table.empty else None
  if read is None:
    return ''
  return (
    f'by churn, {read.changed} of {read.rows} settings changed the model: '
    f'{read.low:.2g}–{read.high:.2g} % of the test predictions differ from the '
    f"reference arm's, {read.ratio_low:.2g}–{read.ratio_high:.2g} × the "
    f'{read.base} between two seeds of one arm ({agreement.seed_verdict(read)})'
  )


def gap_clause(out):
  """The question's pair and its verdict, '' without a decomposition."""
  att = out.attribution
  if not att or not att.decomposition:
    return ''
  d = att.decomposition[0]
  return (
    f'{d.gap.replace(" - ", " − ")}: {d.verdict} (G {signed(d.G.estimate)} '
    f'{interval(d.G.ci_low, d.G.ci_high)} {out.unit} at ±{d.margin:g} {out.unit})'
  )


def sentence(out):
  """'**Answer.** …' in one sentence: the gap of the question's pair, then which settings changed
  the metric on which platform, then the churn against the seed-to-seed churn."""
  platforms = sorted(out.software.platforms)
  where = f'on {listed(platforms)}, ' if platforms else ''
  settings = settings_clause(out)
  parts = [
    p for p in (gap_clause(out), (where + settings) if settings else '', churn_clause(out)) if p
  ]
  if not parts:
    return '**Answer.** Nothing to answer: no two arms with n ≥ 2 each were compared.'
  return f'**Answer.** {"; ".join(parts)}.'
