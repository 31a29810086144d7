"""The churn ladder read in words: each rung's title and span, and the numerics rows read against
the seed-to-seed churn of their platform (how many change the model, as what multiple of a new
seed's churn). analysis/numbers/agreement.py builds the table and its first-page summary line;
analysis/words/answer_sentence.py and analysis/figures/churn_ladder.py reuse the words.
Reference: docs/statistics.md "Agreement between models".
"""

KIND_TITLES = {
  'nondeterminism': 'nondeterminism (same-seed replicates)',
  'identical': 'identical arithmetic (0 by construction)',
  'noise': 'perturbation (noise arm vs its arm)',
  'contrast': 'numerics setting',
  'platform': 'platform',
  'data order': 'data order only (same init seed)',
  'init': 'initial weights only (same data seed)',
  'seed': 'seed: init and data order (two seeds of one arm)',
  'seed_all': 'seed: init and data order (every arm of a platform, clustered)',
}


# What the first page calls each rung (the title's part before ' ('): which source of difference.
SHORT_TITLES = {k: v.split(' (')[0] for k, v in KIND_TITLES.items()}


def rung(table, kind):
  """The rows of one kind, or None."""
  rows = table[table['kind'] == kind]
  return rows if not rows.empty else None


def span(rows):
  """'3.5 %' for one row (or rows that round alike), '1.2–3.5 %' (their range of means)."""
  low, high = (f'{v:.2g}' for v in (rows['churn_pct'].min(), rows['churn_pct'].max()))
  return f'{low} %' if low == high else f'{low}–{high} %'


def rung_text(table, kind):
  """'numerics setting 1.2–3.5 %'; identical arithmetic says whether it was exactly 0."""
  rows = rung(table, kind)
  title = SHORT_TITLES[kind]
  if kind != 'identical':
    return f'{title} {span(rows)}'
  failed = ~rows['check'].str.startswith('exactly 0')
  return (
    f'{title} exactly 0 (checked)'
    if not failed.any()
    else f'{title} {span(rows)}, NOT 0 in {int(failed.sum())} of {len(rows)} pairs'
  )


def baseline(table, platform):
  """(mean, low, high) % of the seed-to-seed churn on `platform`: its pooled 'seed_all' row, else
  its arms' seed rows (mean of their means, the widest bounds); None without either."""
  for kind in ('seed_all', 'seed'):
    rows = table[(table['kind'] == kind) & (table['platform_a'] == platform)]
    if not rows.empty:
      return rows['churn_pct'].mean(), rows['ci_low'].min(), rows['ci_high'].max()
  return None


def against_seeds(table):
  """The numerics rows against the seed-to-seed churn of their platform (baseline), or None
  without both: {'rows', 'changed' (churn above 0), 'low', 'high' (their churn range, %),
  'ratio_low', 'ratio_high' (churn / the seed churn), 'below' / 'above' (how many intervals lie
  wholly below / above the seed churn's), 'base' (the seed churns, text)}."""
  rows = [
    (r, baseline(table, r['platform_a'])) for _, r in table.iterrows() if r['kind'] == 'contrast'
  ]
  rows = [(r, b) for r, b in rows if b is not None and b[0] > 0]
  if not rows:
    return None
  ratio = [r['churn_pct'] / b[0] for r, b in rows]
  churn = [r['churn_pct'] for r, _ in rows]
  return {
    'rows': len(rows),
    'changed': sum(c > 0 for c in churn),
    'low': min(churn),
    'high': max(churn),
    'ratio_low': min(ratio),
    'ratio_high': max(ratio),
    'below': sum(r['ci_high'] < b[1] for r, b in rows),
    'above': sum(r['ci_low'] > b[2] for r, b in rows),
    'base': ', '.join(f'{b:.2g} %' for b in sorted({round(b[0], 6) for _, b in rows})),
  }


def seed_verdict(read):
  """How the settings' churn compares with a new seed's, in words (against_seeds)."""
  if read['below'] == read['rows']:
    return 'every one changes fewer predictions than a new seed does'
  if read['above']:
    return f'{read["above"]} change more predictions than a new seed does'
  return (
    f'{read["below"]} of them change fewer predictions than a new seed does, the others '
    'about as many (intervals overlapping)'
  )


def reading(table):
  """The numerics rows read against the seed-to-seed churn of their platform, in words: how many
  change the model at all (churn > 0), as what multiple of a new seed's churn, and whether their
  intervals lie below, overlap or lie above the seed churn's; '' without both kinds."""
  read = against_seeds(table)
  if read is None:
    return ''
  return (
    f'read against the churn between two seeds ({read["base"]}): {read["changed"]} of '
    f'{read["rows"]} numerics settings change the model (churn above 0), '
    f"{read['ratio_low']:.2g}–{read['ratio_high']:.2g} × a new seed's churn; "
    f'{seed_verdict(read)}'
  )
