"""Which numerical setting explains a difference in a metric: factor effects from a mixed model
over seeds, and the split of the native platform gap into a numerics part and a platform residual.

  python -m analysis.attribution --runs=/tmp/study --factors platform profile --margin 0.3 \
      --noise-arm profile=noise --out /tmp/study
  python -m analysis.attribution --csv=published.csv --factors platform compute_dtype --metric acc

Model (analysis/effects.py). metric ~ factors [+ chosen interactions] + (1 | seed): statsmodels
MixedLM with a random intercept per seed up to effects.MIXED_MAX_ROWS runs; beyond that, or when
the mixed fit fails, OLS with seed fixed effects (within transformation) and seed-clustered errors;
HC3 errors without seed replication; the `method` line says which and why. A design too large for
memory is refused before any fit (effects.check_size). A term `factor=level` is the difference from that factor's
reference level with the other factors held fixed, with its 95% CI. Accuracies stored as fractions
are in percentage points (x100), as in analysis.stats. Only completed runs with a finite metric are
used; the others are listed.

Platform gap. The `native` arm runs each platform's own default arithmetic, so it measures that
platform's arithmetic; the emulated profiles (tpu_default, jax_gpu_default, ...) reproduce one
platform's arithmetic and run on every platform. In an additive model `native` would be the same
arithmetic on every platform, which it is not, so the gap is split in a second fit of the same kind
whose arithmetic factor is crossed with platform (one coefficient per observed (platform, profile)
cell; the other factors additive). For a platform A and the reference platform B:
  native gap  G = native arm on A - native arm on B (adjusted for seed and the other factors);
  numerics    N = cell(profile emulating A) - cell(profile emulating B), averaged over the
                  platforms that ran both, plus, for each other factor whose level differs between
                  the two native arms, its coefficient difference (one row per factor);
  residual    R = G - N: what the emulated arithmetic does not reproduce.
Each is a linear contrast c'b of the coefficients, with standard error sqrt(c'Vc) from the fit's
covariance matrix V (mixed or cluster-robust), so the correlation of G and N (shared runs) is kept.
R is tested against +-margin by two one-sided tests (TOST, Schuirmann 1987; 90% CI): 'explained by
numerics' only if R is equivalent to 0 (TOST p < 0.05), 'not explained' if R's 95% CI excludes 0,
else 'inconclusive'. With one platform (or no native arm) each observed arm is compared with the
reference arm instead, from the main fit.

Noise floor. The sd of the metric over the runs (seeds) of the noise-control arm, and the half-width
of a 95% t interval of the difference of two independent means of that many runs with that sd,
t(0.975, 2n - 2) * sd * sqrt(2 / n): how large a difference replicate noise alone gives.
"""

import argparse
import os
import sys

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import effects, forest, inference, stats
from trainer import record

CELL = 'platform x arithmetic'
def select(frame, metric, factors, seed_col):
  """The usable runs (stats.prepare: completed, finite metric; repeated runs of a seed in one arm
  are kept as observations sharing the seed's intercept, an arm being equal factors, platform,
  device kind and requested numerics), one str column per factor name,
  and whether there is a seed column."""
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  if not factors:
    raise ValueError('--factors: give at least one factor column, e.g. --factors platform profile')
  cols = {f: stats.resolve_column(frame, f, '--factors') for f in factors}
  frame, metric_col = frame.copy(), stats.resolve_column(frame, metric, '--metric')
  values = pd.to_numeric(frame[metric_col], errors='coerce')
  frame[metric_col] = values.where(np.isfinite(values))
  try:
    seed_col, has_seed = stats.resolve_column(frame, seed_col, '--seed-col'), True
  except ValueError:
    if seed_col != 'seed':
      raise
    frame['_row'], seed_col, has_seed = np.arange(len(frame)), '_row', False
  arm = list(dict.fromkeys(list(cols.values()) + record.arm_columns(frame)))
  prep = stats.prepare(frame, arm, metric_col, seed_col)  # a seed counts once per arm
  runs, excluded = prep['runs'], prep['excluded']
  absent = runs[list(cols.values())].isna()
  missing = absent.any(axis=1)
  if missing.any():
    why = [f'no value for {", ".join(absent.columns[row])}' for row in absent[missing].to_numpy()]
    excluded = pd.concat([excluded, pd.DataFrame({'run': runs.loc[missing, 'run'],
                                                  'status': 'completed', 'reason': why})])
    runs = runs[~missing]
  for name, col in cols.items():
    runs[name] = runs[col].astype(str)
  prep.update(runs=runs.reset_index(drop=True), excluded=excluded.reset_index(drop=True),
              columns=cols, has_seed=has_seed)
  return prep


def default_factors(frame):
  """platform, the numerics.requested.* fields and the arm-defining config fields that vary among
  the completed runs (by record.field_name where that names the same column)."""
  done = frame[frame['status'] == 'completed'] if 'status' in frame else frame
  cols = [c for c in record.arm_columns(done) if c != 'device_kind']
  cols = [c for c in cols if done[c].astype(str).nunique() > 1]
  short = record.field_name
  return [short(c) if stats.resolve_column(frame, short(c), '') == c else c for c in cols]


def references(runs, columns, given):
  """{factor: reference level}: given, else the first sorted level (platform: first seen)."""
  chosen = {effects.find_factor(k, columns, '--reference'): v for k, v in given.items()}
  out = {}
  for factor, col in columns.items():
    lv = effects.levels(runs, factor)
    default = runs[factor].iloc[0] if col == 'platform' else lv[0]
    out[factor] = chosen.get(factor, default)
    if out[factor] not in lv:
      raise ValueError(f'--reference: {factor} has no level {out[factor]!r}; levels: {", ".join(lv)}')
  return out


def noise_floor(runs, arm, scale_unit):
  """sd over the noise arm's runs and the 95% half-width of a difference of two such means."""
  if not arm:
    return {'sd': np.nan, 'half': np.nan, 'text': 'noise floor unavailable: no --noise-arm given'}
  mask = pd.Series(True, index=runs.index)
  for name, level in arm.items():
    col = name if name in runs else stats.resolve_column(runs, name, '--noise-arm')
    mask &= runs[col].astype(str) == level
  x = runs.loc[mask, 'value'].to_numpy()
  label = ', '.join(f'{k}={v}' for k, v in arm.items())
  if len(x) < 2:
    raise ValueError(f'--noise-arm: {label} has {len(x)} usable run(s); it needs 2 or more')
  sd = float(np.std(x, ddof=1))
  half = float(sps.t.ppf(0.975, 2 * len(x) - 2) * sd * np.sqrt(2 / len(x)))
  return {'sd': sd, 'half': half, 'text': (
      f'noise floor ({label}, {len(x)} runs): sd between runs {sd:.3f} {scale_unit}; 95% half-width '
      f'of the difference of two independent {len(x)}-run means, t(0.975, {2 * len(x) - 2}) x sd x '
      f'sqrt(2/{len(x)}) = {half:.3f} {scale_unit}')}


def verdict(row, margin):
  """The residual's TOST against +-margin and its reading (see module doc)."""
  lo, hi, p = inference.tost(row['estimate'], row['se'], row['df'], margin) if margin else (np.nan,) * 3
  if margin and p < inference.ALPHA:
    word = 'explained by numerics'
  elif row['ci_low'] > 0 or row['ci_high'] < 0:
    word = 'not explained'
  else:
    word = 'inconclusive' + ('' if margin else ' (no --margin for an equivalence test)')
  return {'ci90_low': lo, 'ci90_high': hi, 'tost_p': p, 'verdict': word}


def cell_weights(X, cell, sign=1.0):
  """Weights of a (platform, profile) cell's coefficient (none for the reference cell)."""
  col = f'{CELL}={cell}'
  return pd.Series({col: sign} if col in X else {}, dtype=float)


def total(weights):
  """Sum of weight Series, a missing column counting as 0."""
  out = pd.Series(dtype=float)
  for w in weights:
    out = out.add(w, fill_value=0.0)
  return out


def gap_rows(model, X, runs, a, b, native, emu, others):
  """Rows (gap, component, contrast...) of platform a's native gap against platform b."""
  nf, nl = native
  nat = lambda p: (runs['platform'] == p) & (runs[nf] == nl)
  gap = X[nat(a)].mean() - X[nat(b)].mean()
  cells = set(runs[CELL])
  both = [p for p in sorted(set(runs['platform'])) if {f'{p}|{emu[a]}', f'{p}|{emu[b]}'} <= cells]
  if not both:
    raise LookupError(f'no platform ran both {nf}={emu[a]} and {nf}={emu[b]}')
  num = total(w for p in both for w in (cell_weights(X, f'{p}|{emu[a]}'),
                                        cell_weights(X, f'{p}|{emu[b]}', -1.0))) / len(both)
  parts = [(f'numerics: {nf} {emu[a]} - {emu[b]} (on {", ".join(both)})', num)]
  for f in others:
    w = gap[[c for c in X if c.startswith(f'{f}=')]]
    if w.abs().sum() > 1e-12:
      parts.append((f'numerics: {f} as in the native arms', w))
  resid = total([gap] + [-w for _, w in parts])
  label = f'{a} - {b}'
  rows = [{'gap': label, 'component': 'native gap', **effects.contrast(model, gap)}]
  rows += [{'gap': label, 'component': name, **effects.contrast(model, w)} for name, w in parts]
  rows.append({'gap': label, 'component': 'platform residual', **effects.contrast(model, resid)})
  return rows


def default_emulation(runs, native_factor, platforms, given):
  """{platform: profile level emulating its native arithmetic}: given, else <p>_default or
  jax_<p>_default when that level exists."""
  lv = set(runs[native_factor])
  out = {}
  for p in platforms:
    guess = [c for c in (f'{p}_default', f'jax_{p}_default') if c in lv]
    out[p] = given.get(p, guess[0] if guess else None)
    if out[p] is None:
      raise LookupError(f'no level of {native_factor} emulates {p}; give --platform-profile {p}=LEVEL')
    if out[p] not in lv:
      raise ValueError(f'--platform-profile: {native_factor} has no level {out[p]!r}; '
                       f'levels: {", ".join(sorted(lv))}')
  return out


def native_arm(runs, columns, given):
  """(factor, level) of the native arm: --native, else a 'profile' factor with a 'native' level."""
  if given:
    (name, level), = given.items() if len(given) == 1 else [(None, None)]
    if name is None:
      raise ValueError('--native: give one factor=level, e.g. --native profile=native')
    factor = effects.find_factor(name, columns, '--native')
    if level not in set(runs[factor]):
      raise ValueError(f'--native: {factor} has no level {level!r}; levels: '
                       f'{", ".join(effects.levels(runs, factor))}')
    return factor, level
  for factor, col in columns.items():
    if col.rsplit('.', 1)[-1] == 'profile' and 'native' in set(runs[factor]):
      return factor, 'native'
  return None


def decompose(runs, y, seeds, columns, ref, native, given_map, margin):
  """(gap table, gap model, emulation map) for each platform against the reference platform."""
  nf, nl = native
  plat = next((f for f, c in columns.items() if c == 'platform'), None)
  order = list(dict.fromkeys(runs['platform']))
  base = ref[plat] if plat else order[0]
  emu = default_emulation(runs, nf, order, given_map)
  runs = runs.assign(**{CELL: runs['platform'] + '|' + runs[nf]})
  if f'{base}|{nl}' not in set(runs[CELL]):
    raise LookupError(f'no {nf}={nl} run on the reference platform {base}')
  others = [f for f in columns if f not in (nf, plat)]
  X = effects.design(runs, [CELL] + others, {CELL: f'{base}|{nl}', **ref})
  model = effects.fit(y, X, seeds)
  rows = []
  for a in order:
    if a != base and f'{a}|{nl}' in set(runs[CELL]):
      rows += gap_rows(model, X, runs, a, base, native, emu, others)
  if not rows:
    raise LookupError(f'no platform other than {base} has a {nf}={nl} run')
  gap = pd.DataFrame(rows)
  resid = gap['component'] == 'platform residual'
  extra = pd.DataFrame([verdict(r, margin) if is_r else {} for is_r, (_, r) in
                        zip(resid, gap.iterrows())], index=gap.index)
  return pd.concat([gap, extra], axis=1), model, emu


def gap_section(prep, y, seeds, columns, ref, native, platform_profile, margin):
  """(gap table or None, note line, emulation used) for run()."""
  runs = prep['runs']
  platforms = list(dict.fromkeys(runs['platform'])) if 'platform' in runs else []
  if len(platforms) < 2:
    return None, (f'runs from one platform ({", ".join(map(str, platforms)) or "unknown"}): no '
                  'platform gap; each arm minus the reference arm instead'), None
  arm = native_arm(runs, columns, effects.parse_pairs(native, '--native'))
  if arm is None:
    return None, ('gap decomposition unavailable: no native arm (give --native factor=level); '
                  'each arm minus the reference arm instead'), None
  given = effects.parse_pairs(platform_profile, '--platform-profile')
  bad = set(given) - set(platforms)
  if bad:
    raise ValueError(f'--platform-profile: no runs on {", ".join(sorted(bad))}; platforms: '
                     f'{", ".join(platforms)}')
  try:
    gap, model, emu = decompose(runs.assign(platform=runs['platform'].astype(str)), y, seeds,
                                columns, ref, arm, given, margin)
  except LookupError as e:
    return None, f'gap decomposition unavailable: {e.args[0]}; each arm minus the reference arm instead', None
  note = (f'native arm {arm[0]}={arm[1]}; emulation of each platform\'s native arithmetic: '
          + ', '.join(f'{p}={q}' for p, q in emu.items())
          + f'. Gap model: {arm[0]} crossed with platform; {model["method"]}. (In the effects '
          f'table above, {arm[0]}={arm[1]} averages the platforms\' different native arithmetics, which '
          f'also biases the platform term; --interactions platform:{arm[0]} separates them.)')
  return gap, note, emu


def run(frame, factors, metric=stats.DEFAULT_METRIC, seed_col='seed', reference=None,
        interactions=(), margin=None, noise_arm=None, native=None, platform_profile=None,
        out_dir=None, source='', margin_reason=None):
  """The whole attribution (see module doc) as a dict: terms (the CSV table), gap, arms, noise,
  model, method, excluded, replicates, text (Markdown) and files (written to out_dir)."""
  if margin is not None and not margin > 0:
    raise ValueError(f'--margin: must be a positive number in the metric\'s units, got {margin}')
  prep = select(frame, metric, list(factors), seed_col)
  runs, columns = prep['runs'], prep['columns']
  ref = references(runs, columns, effects.parse_pairs(reference, '--reference'))
  pairs = []
  for item in interactions or ():
    a, colon, b = str(item).partition(':')
    if not colon:
      raise ValueError(f'--interactions: {item!r} is not A:B; write e.g. --interactions platform:profile')
    pairs.append((effects.find_factor(a, columns, '--interactions'), effects.find_factor(b, columns, '--interactions')))
  X = effects.design(runs, list(columns), ref, pairs)
  y, seeds = runs['value'], runs['seed'] if prep['has_seed'] else None
  model = effects.fit(y, X, seeds)
  unit = 'pp' if prep['scale'] == 100 else 'metric units'
  out = {'metric': prep['metric'], 'source': source, 'reference': ref, 'margin': margin,
         'margin_reason': margin_reason, 'unit': unit,
         'model': effects.formula(prep['metric'], list(columns), ref, pairs, prep['has_seed']),
         'method': model['method'], 'terms': effects.term_table(model, X), 'n_runs': len(runs),
         'excluded': prep['excluded'], 'replicates': prep['replicates'], 'arms': None,
         'noise': noise_floor(runs, effects.parse_pairs(noise_arm, '--noise-arm'), unit)}
  out['gap'], out['gap_note'], out['emulation'] = gap_section(prep, y, seeds, columns, ref, native,
                                                              platform_profile, margin)
  if out['gap'] is None:
    out['arms'] = effects.arm_rows(model, X, runs, list(columns), ref)
  out['text'] = forest.render(out)
  out['files'] = write(out, out_dir) if out_dir else []
  return out


def write(out, out_dir, figures_dir=None):
  """attribution.csv (exact columns), attribution_gap.csv, attribution.md, the forest plot."""
  os.makedirs(out_dir, exist_ok=True)
  files = [os.path.join(out_dir, 'attribution.csv'), os.path.join(out_dir, 'attribution.md')]
  out['terms'][effects.CSV_COLUMNS].to_csv(files[0], index=False)
  with open(files[1], 'w', encoding='utf-8') as f:
    f.write(out['text'])
  if out['gap'] is not None:
    files.append(os.path.join(out_dir, 'attribution_gap.csv'))
    out['gap'].to_csv(files[-1], index=False)
  os.makedirs(figures_dir or out_dir, exist_ok=True)
  return files + forest.plot(out, figures_dir or out_dir)


class Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f'error: {message}; see --help', file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
  p = Parser(prog='python -m analysis.attribution', description=__doc__.split('\n')[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument('--runs', help='root holding the runs (local or gs://)')
  src.add_argument('--csv', help='a CSV of results, one row per run')
  p.add_argument('--metric', default=stats.DEFAULT_METRIC)
  p.add_argument('--factors', nargs='+', required=True, help='factor columns (platform included)')
  p.add_argument('--seed-col', default='seed')
  p.add_argument('--reference', nargs='+', default=[], help='factor=level: reference levels')
  p.add_argument('--interactions', nargs='+', default=[], help='A:B interactions to add')
  p.add_argument('--margin', type=float, default=None, help='equivalence margin (pp for accuracies)')
  p.add_argument('--noise-arm', nargs='+', default=[], help='factor=level: the noise-control arm')
  p.add_argument('--native', nargs='+', default=[], help='factor=level of the native arm')
  p.add_argument('--platform-profile', nargs='+', default=[],
                 help='platform=level: the profile emulating each platform, e.g. gpu=jax_gpu_default')
  p.add_argument('--out', help='folder for attribution.csv/.md and attribution_forest.{pdf,png}')
  return p.parse_args(argv)


def main(argv=None):
  from analysis import results  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  try:
    frame = results.load_runs(args.runs) if args.runs else stats.read_csv(args.csv)
    out = run(frame, args.factors, args.metric, args.seed_col, args.reference, args.interactions,
              args.margin, args.noise_arm, args.native, args.platform_profile, args.out,
              args.runs or args.csv)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(out['text'])
  for path in out['files']:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
