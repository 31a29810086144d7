"""Per-arm summaries, paired tests, the declared contrasts with Holm and the noise floors; the tests
and intervals behind them, each checked against scipy/statsmodels (docs/statistics.md)."""

import dataclasses
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import declaration, inference
from analysis.declaration import resolve_column
from analysis.inputs import Software, arm_labels, seed_key, seed_text, whole_numbers
from runrecord import record, rules

if TYPE_CHECKING:
  from analysis.agreement import Agreement
  from analysis.attribution import Attribution


def run_deterministic(platform, value):
  """(True/False/None, why): does a run on `platform` whose recorded GPU determinism is `value`
  repeat bit for bit for its seed? None: not recorded."""
  kind = rules.jax_platform(platform)
  if kind == 'gpu' and value is not None and not pd.isna(value):
    return bool(value), f'{record.DETERMINISM_COLUMN}={bool(value)}'
  if kind in ('tpu', 'cpu'):
    return True, platform
  return None, f'platform {platform}: determinism not recorded'


def run_status(frame):
  """Each run's status ('completed' where the table has no status column)."""
  return frame['status'] if 'status' in frame else pd.Series('completed', index=frame.index)


def status_reasons(frame):
  """Why each run is not completed: 'failed: loss is NaN', 'running: step 3/10' ('' if it is)."""
  reason = frame['reason'] if 'reason' in frame else pd.Series('', index=frame.index)
  progress = (
    f'step {a}/{b}'
    for a, b in zip(
      frame.get('step', [None] * len(frame)),
      frame.get('total_steps', [None] * len(frame)),
      strict=True,
    )
  )
  return [
    f'{s}: {r}' if isinstance(r, str) and r else f'{s}: {p}' if s != 'completed' else ''
    for s, r, p in zip(run_status(frame), reason, progress, strict=True)
  ]


def replicate_table(runs):
  """One row per arm and seed run more than once: the runs, their values, mean and range."""
  columns = ['arm', 'seed', 'n_runs', 'runs', 'values', 'mean', 'range', 'identical']
  repeated = runs[runs.groupby(['arm', 'seed'], sort=False)['value'].transform('size') > 1]
  if repeated.empty:
    return pd.DataFrame(columns=columns)
  repeated = repeated.assign(text=[f'{x:.4g}' for x in repeated['value']])
  table = (
    repeated.groupby(['arm', 'seed'], sort=False)
    .agg(
      n_runs=('run', 'size'),
      runs=('run', ', '.join),
      values=('text', ', '.join),
      mean=('value', 'mean'),
      low=('value', 'min'),
      high=('value', 'max'),
    )
    .reset_index()
  )
  table['range'] = table['high'] - table['low']
  table['identical'] = table['range'] == 0
  return table[columns]


def lattice(runs, metric, scale):
  """The step of an accuracy measured on one recorded test-set size N (100 / N pp)."""
  if 'acc' not in metric.lower() or 'data.test_size' not in runs:
    return None
  sizes = pd.to_numeric(runs['data.test_size'], errors='coerce').dropna().unique()
  return float(scale / sizes[0]) if len(sizes) == 1 and sizes[0] > 0 else None


DEFAULT_METRIC = record.DEFAULT_METRIC
DEFAULT_MARGIN = declaration.DEFAULT_MARGIN
MAX_ARMS = 200  # 19,900 pairs: about 3 minutes of pairwise tests (10 ms a pair on a 2-core CPU)
EFFECTIVE = 'numerics.effective.'
IDENTICAL_FIELDS = (
  'platform',
  'device_kind',
  'batchnorm_group',
  'compute_dtype',
  'conv_format',
  'dense_format',
  'matmul_precision',
  'param_dtype',
  'xla_flags',
)
# A pair's verdicts, in the order the reports count them (judge).
VERDICTS = (
  'identical arithmetic',
  'within margin',
  'equivalent',
  'different',
  'not equivalent',
  'inconclusive',
)
UNDECLARED = (
  'none declared: 0.5 pp is the analysis.stats default, not a study decision; '
  'declare one (--margin, --margin-reason)'
)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """The runs read for analysis (one row per included run, with its arm, value and model unit),
  one value per arm and seed (`units`), the replicates and the excluded runs."""

  runs: pd.DataFrame
  units: pd.DataFrame
  replicates: pd.DataFrame
  excluded: pd.DataFrame
  seeded: bool
  group_by: Sequence[str]
  metric: str
  scale: float
  pairing: list[str]
  lattice: Optional[float]


@dataclasses.dataclass(frozen=True)
class Stats(Prepared):
  """Prepared plus one row per arm, every pair's tests (empty unless asked), the margin and unit."""

  arms: pd.DataFrame
  pairs: pd.DataFrame
  small: pd.DataFrame
  margin: float
  margin_reason: str
  unit: str


def prepare(frame, group_by, metric, seed_col=None, scale=None):
  """Split the runs into included / excluded, label each included run's arm, average replicates."""
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  if not run_status(frame).eq('completed').any():
    listed = '; '.join(
      f'{run} ({why})' for run, why in zip(frame['run'], status_reasons(frame), strict=True)
    )
    raise ValueError(
      f'--runs/--csv: none of the {len(frame)} runs is completed, so there is nothing to '
      f'analyse; finish or rerun them: {listed}'
    )
  metric = resolve_column(frame, metric, '--metric')
  group_by = [resolve_column(frame, g, '--group-by') for g in group_by] or rules.arm_columns(frame)
  seeded = seed_col is not None or 'seed' in frame.columns
  seed_col = resolve_column(frame, seed_col, '--seed-col') if seed_col else 'seed'
  status = run_status(frame)
  values = pd.to_numeric(frame[metric], errors='coerce')
  bad = status.ne('completed') | ~np.isfinite(values)
  why = [
    w
    if s != 'completed'
    else f'no value for {metric}'
    if pd.isna(v)
    else f'{metric} = {v} is not finite'
    for s, w, v in zip(status[bad], status_reasons(frame[bad]), values[bad], strict=True)
  ]
  excluded = pd.DataFrame({'run': frame.loc[bad, 'run'], 'status': status[bad], 'reason': why})
  excluded, runs = excluded.reset_index(drop=True), frame[~bad].copy()
  if runs.empty:
    raise ValueError(
      f'--runs/--csv: none of the {len(frame)} runs is completed with a {metric}; '
      'see the excluded list'
    )
  if scale is None:
    scale = 100.0 if 'acc' in metric.lower() and values[runs.index].abs().max() <= 1 else 1.0
  runs['value'] = values[runs.index] * scale
  runs['base_seed'] = whole_numbers(runs[seed_col]) if seeded else None
  parts = [runs[c] if seed_col == 'seed' and c in runs else None for c in record.SEED_PARTS]
  keys = rules.model_keys(runs['base_seed'], *parts) if seeded else None
  runs['seed'] = pd.Series(keys, index=runs.index, dtype=object) if seeded else None
  runs['seeded'] = seeded & runs['seed'].notna()
  runs['arm'] = arm_labels(runs, group_by)
  unknown = [None] * len(runs)
  det = [
    run_deterministic(p, v)
    for p, v in zip(
      runs.get('platform', unknown), runs.get(record.DETERMINISM_COLUMN, unknown), strict=True
    )
  ]
  runs['det'], runs['det_why'] = [d for d, _ in det], [w for _, w in det]
  seeded_runs = runs[runs['seeded']]
  return Prepared(
    runs=runs,
    units=runs.assign(unit=runs['seed'].where(runs['seeded'], runs['run']))
    .groupby(['arm', 'unit'], sort=False)
    .agg(seed=('seed', 'first'), value=('value', 'mean'), n_runs=('run', 'size'))
    .reset_index()[['arm', 'seed', 'unit', 'value', 'n_runs']],
    replicates=replicate_table(seeded_runs),
    excluded=excluded,
    seeded=seeded,
    group_by=group_by,
    metric=metric,
    scale=scale,
    pairing=rules.pairing_columns(frame.columns),
    lattice=lattice(runs, metric, scale),
  )


def identical_arithmetic(prep, arm_a, arm_b):
  """Do the two arms' records give the same effective arithmetic (IDENTICAL_FIELDS)?"""
  runs = prep.runs
  cols = [EFFECTIVE + f for f in IDENTICAL_FIELDS]
  if not all(c in runs for c in cols[:2]):
    return False
  cols = [c for c in cols if c in runs]
  values = [
    runs.loc[runs['arm'] == arm, cols].astype(str).drop_duplicates() for arm in (arm_a, arm_b)
  ]
  return all(len(v) == 1 for v in values) and values[0].iloc[0].equals(values[1].iloc[0])


def determinism(runs, reps):
  """(True/False/None, why) for one arm: recorded determinism."""
  clash = reps[~reps['identical'].astype(bool)]
  if not clash.empty:
    return False, f'seed {clash["seed"].iloc[0]} repeated with a different value'
  known = [d for d in runs['det'] if d is not None]
  why = '; '.join(sorted(set(runs['det_why'])))
  if len(known) < len(runs):
    return None, why + ('; repeated seeds gave identical values' if not reps.empty else '')
  return all(known), why


def arm_table(prep):
  """Raises (naming --group-by) beyond MAX_ARMS arms, before any per-arm work."""
  arms = prep.units['arm'].nunique()
  if arms > MAX_ARMS:
    by = ', '.join(rules.field_name(g) for g in prep.group_by)
    raise ValueError(
      f'--group-by: {arms:,} arms (by {by}), more than this report holds '
      f'({MAX_ARMS} arms at most: up to {MAX_ARMS * (MAX_ARMS - 1) // 2:,} pairs of '
      'tests, minutes); group by fewer or coarser columns'
    )
  rows = []
  for arm, units in prep.units.groupby('arm', sort=True):
    runs = prep.runs[prep.runs['arm'] == arm]
    reps = prep.replicates[prep.replicates['arm'] == arm]
    x = units['value'].to_numpy()
    low, high, method = inference.mean_ci(x)
    seeded = runs[runs['seeded']]
    wsd, wdf = inference.within_sd(seeded['value'], seeded['seed'])
    det, why = determinism(runs, reps)
    rows.append(
      {
        'arm': arm,
        **{g: runs[g].iloc[0] for g in prep.group_by},
        'n': len(x),
        'n_runs': len(runs),
        'mean': x.mean(),
        'sd': x.std(ddof=1) if len(x) > 1 else np.nan,
        'ci_low': low,
        'ci_high': high,
        'ci_method': method,
        'within_sd': wsd,
        'within_df': wdf,
        'deterministic': det,
        'determinism': why,
        'seeds': seed_text(units['seed']),
      }
    )
  return pd.DataFrame(rows)


def design(prep, arm_a, arm_b):
  """(paired, shared seeds, why): paired when 2+ shared seeds share their pairing fields."""
  if not prep.seeded:
    return False, [], 'unpaired: no seed column, each row is its own run'
  units = prep.units
  seeds_a = set(units.loc[units['arm'] == arm_a, 'seed'].dropna())
  seeds_b = set(units.loc[units['arm'] == arm_b, 'seed'].dropna())
  shared = sorted(seeds_a & seeds_b, key=seed_key)
  if len(shared) < 2:
    return (
      False,
      shared,
      ('unpaired: no shared seeds' if not shared else 'unpaired: 1 shared seed, 2 needed'),
    )
  runs = prep.runs
  both = runs[runs['arm'].isin([arm_a, arm_b]) & runs['seed'].isin(shared)]
  values = both[prep.pairing].astype(str).groupby(both['seed']).nunique()
  differ = [c for c in prep.pairing if (values[c] > 1).any()]
  if differ:
    return False, shared, f'unpaired: pairing fields differ: {", ".join(differ)}'
  how = (
    'same init and data order'
    if prep.pairing
    else 'same seed taken as same init and data order (no pairing fields recorded)'
  )
  left = len(seeds_a | seeds_b) - len(shared)
  rest = f'; {left} unshared seed(s) left out of the paired tests' if left else ''
  rest += f'; only {len(shared)} shared: {len(shared) - 1} df' if len(shared) < 3 else ''
  return True, shared, f'paired: {len(shared)} shared seeds, {how}{rest}'


def values_by_seed(prep, arm, seeds):
  units = prep.units[prep.units['arm'] == arm].set_index('seed')
  return units.loc[seeds, 'value'].to_numpy()


def compare(prep, arm_a, arm_b, margin):
  """Every test of one pair of arms (a dict of pair_table's columns, before Holm)."""
  units = prep.units
  a = units.loc[units['arm'] == arm_a, 'value'].to_numpy()
  b = units.loc[units['arm'] == arm_b, 'value'].to_numpy()
  is_paired, shared, why = design(prep, arm_a, arm_b)
  t, df, p = inference.welch(a, b)
  row = {
    'arm_a': arm_a,
    'arm_b': arm_b,
    'n_a': len(a),
    'n_b': len(b),
    'paired': is_paired,
    'design': why,
    'n_pairs': len(shared) if is_paired else 0,
    'welch_t': t,
    'welch_df': df,
    'welch_p': p,
    **dict.fromkeys(('paired_t', 'paired_p', 'mw_u', 'mw_p'), np.nan),
    'mw_method': 'not used (paired)',
    **dict.fromkeys(('signed_rank_w', 'signed_rank_p'), np.nan),
    'signed_rank_method': 'not used (unpaired)',
    **dict.fromkeys(('hedges_g', 'd_z'), np.nan),
    'identical': False,
  }
  if is_paired:
    xa, xb = values_by_seed(prep, arm_a, shared), values_by_seed(prep, arm_b, shared)
    d, n = xa - xb, len(shared)
    row['paired_t'], df, row['paired_p'] = inference.paired(xa, xb)
    row['signed_rank_w'], row['signed_rank_p'], row['signed_rank_method'] = inference.signed_rank(d)
    row.update(
      rank_test='signed-rank',
      rank_p=row['signed_rank_p'],
      d_z=inference.d_z(d),
      identical=bool(np.all(d == 0)) and identical_arithmetic(prep, arm_a, arm_b),
    )
    sd = inference.spread_sd(d)
    se = sd / np.sqrt(n)
    row.update(diff=d.mean(), test='paired t', test_p=row['paired_p'], power_from=f'{n} pairs')
  else:
    row['mw_u'], row['mw_p'], row['mw_method'] = inference.mann_whitney(a, b)
    row.update(rank_test='Mann–Whitney', rank_p=row['mw_p'], hedges_g=inference.hedges_g(a, b))
    se, df = inference.welch_se_df(a, b)
    sd = np.sqrt(
      ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    )
    n = min(len(a), len(b))
    what = 'seeds' if prep.seeded else 'runs'
    row.update(
      diff=a.mean() - b.mean(), test='Welch t', test_p=p, power_from=f'{len(a)} + {len(b)} {what}'
    )
  row['power_sd'], row['power_n'] = sd, n
  row['ci95_low'], row['ci95_high'] = inference.diff_ci(row['diff'], se, df, 1 - inference.ALPHA)
  row['ci90_low'], row['ci90_high'], row['tost_p'] = inference.tost(row['diff'], se, df, margin)
  row['power_diff'], row['power_equiv'] = inference.power_at(sd, margin, n, is_paired)
  row['n80_diff'], row['n80_equiv'] = inference.seeds_needed(sd, margin, is_paired)
  row['lattice'] = prep.lattice
  return row


def judge(rows, margin):
  """The pair table of compare() rows judged as one family at ±`margin`."""
  pairs = pd.DataFrame(rows)
  if pairs.empty:
    return pairs
  tested = ~pairs['identical'].astype(bool)
  for test in ('welch', 'paired', 'tost', 'mw', 'signed_rank', 'rank', 'test'):
    pairs[f'{test}_p_holm'] = inference.holm(pairs[f'{test}_p'].where(tested))
  pairs['equivalent_raw'] = (pairs['tost_p'] < inference.ALPHA) & tested
  pairs['equivalent'] = pairs['tost_p_holm'] < inference.ALPHA
  on_lattice = pairs['lattice'].notna()
  pairs['different'] = (
    (pairs['test_p_holm'] < inference.ALPHA)
    & ((pairs['ci95_low'] > 0) | (pairs['ci95_high'] < 0))
    & (~on_lattice | (pairs['rank_p_holm'] < inference.ALPHA))
  )
  beyond = (pairs['ci90_low'] > margin) | (pairs['ci90_high'] < -margin)
  pairs['verdict'] = np.select(
    [~tested, pairs['equivalent'] & pairs['different'], pairs['equivalent'], pairs['different']]
    + [beyond],
    ['identical arithmetic', 'within margin', 'equivalent', 'different', 'not equivalent'],
    'inconclusive',
  )
  return pairs


def family_size(table):
  """The number of comparisons Holm adjusts over: the judged ones but identical arithmetic."""
  return int((table['verdict'] != 'identical arithmetic').sum()) if not table.empty else 0


def pair_table(prep, arms, margin):
  """One row per pair of arms with n >= 2 (arm_a before arm_b; diff = mean A − mean B)."""
  ok = arms.loc[arms['n'] >= 2, 'arm']
  return judge([compare(prep, a, b, margin) for a, b in itertools.combinations(ok, 2)], margin)


def margin_choice(margin=None, reason=None, declared=None, declared_reason=None):
  """(margin, reason text): the study's declared margin unless `margin`."""
  if margin is not None:
    margin = declaration.check_margin(margin, '--margin')
  if declared is not None:
    declared = declaration.check_margin(
      declared, "the study's declared margin (study.json or get_study(): margin)"
    )
  if margin is None and declared is None:
    return DEFAULT_MARGIN, UNDECLARED
  if margin is None or margin == declared:
    return declared, declared_reason or 'the study declares it without a reason'
  text = f'from --margin: {reason or "no reason given"}'
  if declared is not None:
    text += f'; the study declares {declared:g} pp: {declared_reason or "no reason given"}'
  return margin, text


def arms_and_pairs(
  frame,
  group_by=(),
  metric=DEFAULT_METRIC,
  margin=DEFAULT_MARGIN,
  margin_reason=None,
  seed_col=None,
  scale=None,
  all_pairs=True,
):
  """The Stats of the runs: prepare's, the arm table and (`all_pairs`) every pair judged."""
  if not margin > 0:
    raise ValueError(f'--margin: must be a positive number of percentage points, got {margin}')
  prep = prepare(frame, list(group_by), metric, seed_col, scale)
  arms = arm_table(prep)
  return Stats(
    **vars(prep),
    arms=arms,
    pairs=pair_table(prep, arms, margin) if all_pairs else pd.DataFrame(),
    small=arms[arms['n'] < 2],
    margin=margin,
    margin_reason=margin_reason or 'no reason given',
    unit='pp' if prep.scale == 100 else 'units',
  )


def factor_columns(runs, declared):
  """{factor: column} of the declared factors other than platform."""
  factors = [f for f in declared.get('factors') or [] if f != 'platform']
  if not factors:
    raise ValueError('--study: the declaration names no factors; add factors to get_study()')
  return {f: resolve_column(runs, f, '--study (factors)') for f in factors}


def matches(levels, wanted):
  """Do the arm's levels equal every level of `wanted` ({factor: level}) that it has?"""
  wanted = {f: declaration.level_text(v) for f, v in (wanted or {}).items() if f in levels}
  return bool(wanted) and all(levels[f] == v for f, v in wanted.items())


def arm_levels(out, declared):
  """One row per arm of stats.arms_and_pairs's `out`: arm, platform, each factor's level."""
  runs = out.runs
  columns = factor_columns(runs, declared)
  first = runs.groupby('arm', sort=False).first()
  n = out.arms.set_index('arm')['n']
  rows = []
  for arm, r in first.iterrows():
    levels = {f: declaration.level_text(r[c]) for f, c in columns.items()}
    role = (
      'reference'
      if matches(levels, declared.get('reference'))
      else 'noise'
      if matches(levels, declared.get('noise_arm'))
      else 'arm'
    )
    differ = [
      i
      for i, f in enumerate(columns)
      if levels[f] != declaration.level_text((declared.get('reference') or {}).get(f))
    ]
    rows.append(
      {
        'arm': arm,
        'platform': str(r['platform']) if 'platform' in r else '',
        **levels,
        'label': declaration.arm_label(declared, levels),
        'role': role,
        'n': n[arm],
        'order': ({'reference': -1, 'noise': len(columns)}.get(role, min(differ or [0]))),
      }
    )
  table = pd.DataFrame(rows).sort_values(['platform', 'order', 'label'], kind='stable')
  clash = table[table.duplicated(['platform', 'label'], keep=False)]
  if not clash.empty:
    a, b = clash['arm'].iloc[:2]
    raise ValueError(
      f'--study: arms {a!r} and {b!r} ({len(clash)} arms in all) have the same declared '
      'factor levels on one platform; declare the factor that separates them '
      '(get_study factors) or --group-by only the declared ones'
    )
  return table.reset_index(drop=True)


def family(arms):
  """[(arm, reference arm)] of the declared contrasts, in platform and arm order."""
  pairs = []
  for _, group in arms.groupby('platform', sort=False):
    ref = group[group['role'] == 'reference']
    if len(ref) == 1 and ref['n'].iloc[0] >= 2:
      pairs += [
        (a, ref['arm'].iloc[0])
        for a in group.loc[(group['role'] != 'reference') & (group['n'] >= 2), 'arm']
      ]
  return pairs


def contrast_table(out, declared, margin=None):
  """The declared contrasts judged as one family (compare rows + judge) with platform."""
  arms = out.arm_info
  arms = arm_levels(out, declared) if arms is None else arms
  margin = margin or out.margin
  table = judge([compare(out, a, b, margin) for a, b in family(arms)], margin)
  if table.empty:
    return table
  info = arms.set_index('arm')
  for col in ('platform', 'label', 'role'):
    table[col] = [info.loc[a, col] for a in table['arm_a']]
  return table


class NoiseFloor(NamedTuple):
  """The paired difference noise arm − the arm it perturbs (`what`) over `n` seeds: its sd and the
  95% half-width of its mean, t(0.975, n − 1) × sd / √n."""

  sd: float
  half: float
  n: int
  what: str


def arm_mask(runs, levels, flag):
  """Rows of `runs` whose factor columns hold `levels` ({factor name: level})."""
  mask = pd.Series(True, index=runs.index)
  for name, level in levels.items():
    col = name if name in runs else resolve_column(runs, name, flag)
    mask &= runs[col].astype(str) == str(level)
  return mask


def noise_floor(runs, arm, base, factors=()):
  """The NoiseFloor of one platform's runs: noise arm `arm` against `base`."""

  def label(levels):
    return ', '.join(f'{k}={v}' for k, v in levels.items())

  noisy_runs = runs[arm_mask(runs, arm, '--noise-arm')]
  noisy = noisy_runs.groupby('seed')['value'].mean()
  named = {k if k in runs else resolve_column(runs, k, '--noise-of') for k in {**base, **arm}}
  same = {
    f: noisy_runs[f].astype(str).iloc[0]
    for f in factors
    if f not in named
    and f in runs
    and f != 'platform'
    and not noisy_runs.empty
    and noisy_runs[f].astype(str).nunique() == 1
  }
  clean_runs = runs[arm_mask(runs, {**base, **same}, '--noise-of')]
  if 'arm' in clean_runs and (clean_runs.groupby('seed')['arm'].nunique() > 1).any():
    raise ValueError(
      f'--noise-of: {label(base)} matches {clean_runs["arm"].nunique()} arms on one '
      'seed; name every factor of the arm the noise arm perturbs'
    )
  clean = clean_runs.groupby('seed')['value'].mean()
  d = (noisy - clean).dropna().to_numpy()
  if len(d) < 2:
    raise ValueError(
      f'--noise-arm: {label(arm)} shares {len(d)} seed(s) with {label(base)}; it needs 2 or more'
    )
  sd = inference.spread_sd(d)
  half = float(sps.t.ppf(0.975, len(d) - 1) * sd / np.sqrt(len(d)))
  levels = {**base, **same}  # the base arm's levels; the noise arm's other levels are the same
  changed = [k for k in arm if k not in levels or str(levels[k]) != str(arm[k])]
  common = {k: v for k, v in levels.items() if k not in changed}
  what = (
    f'{label({k: arm[k] for k in changed})} − '
    f'{label({k: levels[k] for k in changed if k in levels})}'
    + (f' at {label(common)}' if common else '')
  )
  return NoiseFloor(sd, half, len(d), what)


def noise_floors(runs, arm, base, factors=()):
  """{platform: NoiseFloor} of each platform where the noise arm and its base share 2+ seeds."""
  if not arm:
    return {}
  platforms = (
    runs['platform'].astype(str) if 'platform' in runs else pd.Series('', index=runs.index)
  )
  floors = {}
  for platform, group in runs.groupby(platforms, sort=True):
    try:
      floors[platform] = noise_floor(group, arm, base, factors)
    except ValueError as e:
      if '--noise-of' in str(e) and 'matches' in str(e):
        raise
  return floors


def arm_short_labels(out):
  """{arm: short label}: the declaration's ('gpu: bf16 activations' with several platforms)."""
  if out.arm_info is not None:
    info = out.arm_info
    several = info['platform'].nunique() > 1
    return {r.arm: f'{r.platform}: {r.label}' if several else r.label for r in info.itertuples()}
  return {a: a for a in out.arms['arm']}


@dataclasses.dataclass(frozen=True)
class Scope:
  """Confirmatory (True), exploratory (False) or nothing declared (None), and the deviations."""

  declared_seeds: Optional[list[int]]
  declared_margin: Optional[float]
  analysed_seeds: list[int]
  margin: float
  deviations: list[str]
  declared_seeds_present: bool
  confirmatory: Optional[bool]


def scope(out, declared, compare=None):
  """The Scope of `out`: confirmatory for the declared seeds, margin and platform pairs."""
  m0 = declared.get('margin')
  seeds = sorted({int(x) for x in out.runs['base_seed'].dropna()}) if out.seeded else []
  wanted = declaration.declared_seeds(declared)
  deviations = []
  if wanted is not None and seeds != sorted(wanted):
    deviations.append(
      f'runs on {len(seeds)} seeds ({out.arms["n"].max()} per arm at most), {len(wanted)} '
      f'declared (seeds {seed_text(pd.Series(wanted))})'
    )
  if m0 is not None and out.margin != m0:
    deviations.append(f'margin ±{out.margin:g}, declared ±{m0:g}')
  if compare:
    said = declaration.pairs_text(declared['compare']) if declared.get('compare') else 'every pair'
    deviations.append(
      f'platform pairs {declaration.pairs_text(compare)} from --compare (declared: {said})'
    )
  known = wanted is not None or m0 is not None or bool(compare)
  return Scope(
    declared_seeds=wanted,
    declared_margin=m0,
    analysed_seeds=seeds,
    margin=out.margin,
    deviations=deviations,
    declared_seeds_present=bool(wanted)
    and set(wanted) <= set(seeds)
    and (set(wanted) != set(seeds) or m0 is not None or bool(compare)),
    confirmatory=(not deviations) if known else None,
  )


@dataclasses.dataclass(frozen=True)
class Analysis(Stats):
  """A study's whole analysis (analyse.study_analysis): Stats, its declaration and declared
  contrasts, noise floors, attribution, software, agreement, scope and the confirmatory one."""

  declared: dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = ''
  contrasts: Optional[pd.DataFrame] = None
  arm_info: Optional[pd.DataFrame] = None
  noise: dict[str, NoiseFloor] = dataclasses.field(default_factory=dict)
  attribution: Optional['Attribution'] = None
  software: Optional[Software] = None
  agreement: Optional['Agreement'] = None
  scope: Optional[Scope] = None
  confirmatory: Optional['Analysis'] = None


INIT_COLUMNS = ('init_seed', 'config.init_seed')
DATA_COLUMNS = ('data_seed', 'config.data_seed')


def seed_columns(runs):
  """(init column, data column) the runs table records, or None when it has no such pair."""
  init = next((c for c in INIT_COLUMNS if c in runs and runs[c].notna().any()), None)
  data = next((c for c in DATA_COLUMNS if c in runs and runs[c].notna().any()), None)
  return (init, data) if init and data else None


def variance_table(runs, value='value'):
  """variance_components per arm whose runs set init and data-order seeds apart."""
  return split_by_arm(runs, value)[0]


def split_by_arm(runs, value='value'):
  """(variance_table, notes): why an arm whose seeds vary has no split."""
  columns = seed_columns(runs)
  if columns is None:
    return pd.DataFrame(), []
  tables, notes = [], []
  for arm, group in runs.groupby('arm', sort=True):
    if group[columns[0]].nunique() < 2 and group[columns[1]].nunique() < 2:
      continue  # one init and one data seed (or seed = init = data): no split to make
    if (group[columns[0]].astype(str) == group[columns[1]].astype(str)).all():
      continue  # init and data seeds move together: the seeds of an ordinary study
    try:
      table = inference.variance_components(group, value, *columns)
    except ValueError as e:
      notes.append(f'{arm}: {e}')
      continue
    tables.append(table.assign(arm=arm, runs=len(group)))
  return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), notes
