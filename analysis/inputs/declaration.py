"""A study's declaration: what its analysis tests, fixed before the first run.

A config file's `get_study(arg=None)` returns it as a dict; every key is optional (null: not
declared), and no other key is taken (SCHEMA; `check` refuses an unknown key naming the nearest):
  margin, margin_reason     the equivalence margin (pp; a number in (0, MAX_MARGIN]) and why
  factors                   the factors that define the arms (platform included): a list of names
  reference                 {factor: level}: the reference arm every other arm is compared with
  noise_arm                 {factor: level}: the noise control
  noise_of                  {factor: level}: the arm the noise control perturbs (the noise floor
                            is the paired sd of their difference; default: the reference arm)
  min_share, min_share_reason  the share of the platform gap the numerics part must reach (lower
                            95% bound, in (0, 1]) for "explained by numerics"
                            (analysis/numbers/gap_verdict.py)
  native, platform_profile  the native arm ({factor: level}, one entry) and the profile level
                            emulating each platform ({platform: level}; the gap decomposition,
                            analysis/numbers/gap.py)
  labels                    {factor: '{}'-format text or {level: label}}: short arm labels
  compare                   [[A, B], ...]: the platform pairs whose gap G = A − B is decomposed
                            and judged, the question's pair first (default: every pair of the
                            platforms run, tpu before gpu before cpu: analysis/numbers/gap.py
                            default_pairs); --compare overrides it, as an exploratory analysis
  seed_sd, paired_sd        positive numbers (pp), seeds a positive count k (seeds 0..k-1) or a
                            list of whole-number seeds, and their *_source (text): the power
                            calculation behind the seed count
The arms and levels it names must exist among the runs analysed (`check_levels`: a typo in a
level is one line naming the file, the key and the nearest level, never a flag not given).
sweeps.sweep (and so sweeps.run_study) writes it into the root as STUDY_FILE before the first run
and refuses a changed declaration once runs exist; the analysis reads it from there, so its tests
are the ones declared before the data existed (analysis/numbers/contrasts.py).

  declared = load('configs/digits.py:study')          # a config file, or a study.json file
  declared = from_roots(['runs/cpu', 'gs://b/gpu'])   # the roots' study.json (they must agree)
Reference: docs/statistics.md "A study and its declaration".
"""

import difflib
import json
import os
from typing import Any, Union

from etils import epath

from analysis.inputs.declaration_values import (
  arm_problem,
  compare_problem,
  factors_problem,
  labels_problem,
  margin_problem,
  pairs_of,
  platform_profile_problem,
  positive_problem,
  seeds_problem,
  share_problem,
  text_problem,
)

STUDY_FILE = 'study.json'
# The defaults where a study declares none (light here, so that the commands' --help needs no
# statistics library): the equivalence margin, pp (analysis.numbers.stats), and the share of the
# gap the numerics part must reach (analysis.numbers.gap_verdict).
DEFAULT_MARGIN = 0.5
MIN_SHARE = 0.5


# Every key a declaration may hold, and why a value is not one (None: it is).
SCHEMA = {
  'margin': margin_problem,
  'margin_reason': text_problem,
  'factors': factors_problem,
  'reference': arm_problem,
  'noise_arm': arm_problem,
  'noise_of': arm_problem,
  'native': lambda v: arm_problem(v, single=True),
  'platform_profile': platform_profile_problem,
  'compare': compare_problem,
  'min_share': share_problem,
  'min_share_reason': text_problem,
  'labels': labels_problem,
  'seed_sd': positive_problem,
  'paired_sd': positive_problem,
  'seeds': seeds_problem,
  'seed_sd_source': text_problem,
  'paired_sd_source': text_problem,
}
ARMS = ('reference', 'noise_arm', 'noise_of', 'native')  # the keys naming an arm {factor: level}


def nearest_key(key):
  close = difflib.get_close_matches(str(key), SCHEMA, n=1, cutoff=0.6)
  return f'did you mean {close[0]!r}?' if close else f'the keys: {", ".join(SCHEMA)}'


def problems(declared):
  """['key: why', ...]: every unknown key (with the nearest known one), every value of the wrong
  type or range (SCHEMA), and every factor an arm or label names outside `factors`."""
  lines = [
    f'{key!r} is not a declaration key; {nearest_key(key)}' for key in declared if key not in SCHEMA
  ]
  for key, problem_of in SCHEMA.items():
    value = declared.get(key)
    problem = None if value is None else problem_of(value)
    if problem:
      lines.append(f'{key}: {problem}')
  factors = declared.get('factors')
  if isinstance(factors, list) and not factors_problem(factors):
    named = [
      (k, f)
      for k in ARMS
      if pairs_of(declared.get(k)) and not arm_problem(declared[k])
      for f in pairs_of(declared[k])
    ]
    named += [
      ('labels', f)
      for f in declared.get('labels') or {}
      if isinstance(declared.get('labels'), dict)
    ]
    lines += [
      f'{key}: {factor!r} is not one of the declared factors ({", ".join(factors)}); '
      + (f'did you mean {close[0]!r}? ' if close else '')
      + 'add it to factors, or correct it'
      for key, factor in named
      if factor not in factors
      for close in [difflib.get_close_matches(factor, factors, n=1)]
    ]
  return lines


def check(declared, where):
  """The declaration, every key checked against SCHEMA (problems); a ValueError of one line per
  problem, each naming `where` (the file, or 'SPEC get_study()') and the key."""
  lines = problems(declared)
  if lines:
    raise ValueError('\n'.join(f'{where}: {line}' for line in lines))
  return declared


def declared_seeds(declared):
  """The seeds the declaration names, in order: 0..k-1 for a count k, the list as given; None when
  it names none."""
  seeds = (declared or {}).get('seeds')
  if seeds is None:
    return None
  return [int(s) for s in seeds] if isinstance(seeds, list) else list(range(int(seeds)))


def level_problems(declared, frame):
  """['key: why', ...]: each declared factor that is no column of the runs table `frame`, and each
  level an arm (ARMS) or platform_profile names that no run has (with the nearest level)."""
  # pandas comes with the runs: imported here so that the command lines stay light (arguments.py)
  from analysis.inputs import columns

  factors = [f for f in declared.get('factors') or []]
  found, lines = {}, []
  for factor in factors:
    try:
      found[factor] = columns.resolve_column(frame, factor, 'factors')
    except ValueError:
      close = difflib.get_close_matches(factor, [c.rsplit('.', 1)[-1] for c in frame.columns], n=1)
      lines.append(
        f'factors: no column {factor!r} among the runs'
        + (f'; did you mean {close[0]!r}?' if close else '')
      )
  levels = {
    f: sorted({level_text(v) for v in frame[c].dropna().unique()}) for f, c in found.items()
  }

  def missing(key, factor, level):
    if factor not in levels or level_text(level) in levels[factor]:
      return None
    close = difflib.get_close_matches(level_text(level), levels[factor], n=1)
    return (
      f'{key}: no run has {factor}={level_text(level)} (levels among the {len(frame)} runs: '
      f'{", ".join(levels[factor])})'
      + (f'; did you mean {close[0]!r}?' if close else '')
      + '; correct it, or analyse once its runs exist'
    )

  for key in ARMS:
    for factor, level in (pairs_of(declared.get(key)) or {}).items():
      lines.append(missing(key, factor, level))
  native = next(iter(pairs_of(declared.get('native')) or {'profile': None}))
  platforms = set(frame['platform'].dropna().astype(str)) if 'platform' in frame else set()
  for platform, level in (declared.get('platform_profile') or {}).items():
    present = any(p == platform or p.split('-', 1)[0] == platform for p in platforms)
    lines.append(missing('platform_profile', native, level) if present else None)
  return [line for line in lines if line]


def check_levels(declared, frame, where):
  """The declaration against the runs it is to analyse: one line per problem (level_problems),
  each naming `where` and the key, as a ValueError; nothing when it holds."""
  lines = level_problems(declared or {}, frame)
  if lines:
    raise ValueError('\n'.join(f'{where}: {line}' for line in lines))


def normalise(declared):
  """The declaration as JSON reads it back (tuples as lists, keys as text)."""
  return json.loads(json.dumps(declared or {}, sort_keys=True))


def from_config(spec):
  """The get_study(arg) dict of the config file in `spec` ('FILE[:ARG]'); {} without get_study."""
  # ml_collections comes with a config file: imported here so that the command lines stay light
  from configs import loader

  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  declared = module.get_study(arg or None) if hasattr(module, 'get_study') else {}
  if not isinstance(declared, dict):
    raise ValueError(f'{path}: get_study() must return a dict (margin, factors, reference, ...)')
  return check(normalise(declared), f'{spec} get_study()')


def unique_keys(pairs):
  """json's object_pairs_hook: the object, a key given twice refused (json keeps the last)."""
  keys = [k for k, _ in pairs]
  twice = [k for k in dict.fromkeys(keys) if keys.count(k) > 1]
  if twice:
    raise ValueError(f'the key {twice[0]!r} is given twice; give it once')
  return dict(pairs)


def read_file(path):
  """A declaration written as JSON (a root's STUDY_FILE; a UTF-8 byte-order mark is read past, a
  key given twice refused)."""
  try:
    declared = json.loads(
      epath.Path(path).read_bytes().decode('utf-8-sig'), object_pairs_hook=unique_keys
    )
  except (OSError, ValueError) as e:
    raise ValueError(
      f'--study: cannot read {path} as a study declaration ({e}); give a '
      f'{STUDY_FILE} or a config file with get_study()'
    ) from None
  if not isinstance(declared, dict):
    raise ValueError(
      f'--study: {path} holds no declaration (a JSON object); see analysis/inputs/declaration.py'
    )
  return check(declared, str(path))


def load(source: Union[str, os.PathLike[str]]) -> dict[str, Any]:
  """The declaration in `source`: a .json file, or a config spec 'FILE[:ARG]' (get_study).

  Returns:
    The declaration as written ({} for a config file without get_study), not yet checked against
    the runs (check_levels).

  Raises:
    ValueError: one line naming --study (an unreadable or malformed file, a key given twice).
  """
  return read_file(source) if str(source).endswith('.json') else from_config(source)


def add_study_argument(parser):
  """The --study flag of the commands that read a declaration."""
  parser.add_argument(
    '--study',
    default=None,
    help="the study's declaration: a study.json, or a config file with "
    'get_study() (default: the study.json in the roots)',
  )


def differences(saved, declared):
  """['margin: 2.0 -> 1.0', ...]: the keys in which `declared` differs from `saved`."""
  saved, declared = normalise(saved), normalise(declared)
  return [
    f'{k}: {json.dumps(saved.get(k))} -> {json.dumps(declared.get(k))}'
    for k in sorted(set(saved) | set(declared))
    if saved.get(k) != declared.get(k)
  ]


def from_roots(roots):
  """(declaration, where) from the roots' STUDY_FILE: ({}, None) when none has one; a root
  without one is fine, two that differ are a ValueError."""
  found = []
  for root in roots:
    path = epath.Path(root) / STUDY_FILE
    if path.exists():
      found.append((str(path), read_file(path)))
  for path, declared in found[1:]:
    diff = differences(found[0][1], declared)
    if diff:
      raise ValueError(
        f'--runs: {found[0][0]} and {path} declare different studies '
        f'({"; ".join(diff[:2])}); analyse them apart, or give --study'
      )
  return (found[0][1], found[0][0]) if found else ({}, None)


def dumps(declared):
  """The declaration as the JSON text of a STUDY_FILE."""
  return json.dumps(normalise(declared), indent=1, sort_keys=True) + '\n'


def write(root, declared):
  """Write the declaration into the root (STUDY_FILE); returns the path."""
  path = epath.Path(root) / STUDY_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(dumps(declared))
  return str(path)


def level_text(value):
  """A level as the declaration writes it: 16 and 16.0 are '16'."""
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  return str(value)


def factor_label(declared, factor, level):
  """The short label of one factor level: the declared format or mapping, else 'factor=level'."""
  spec = (declared.get('labels') or {}).get(factor)
  if isinstance(spec, dict):
    return spec.get(level, f'{factor}={level}')
  return spec.format(level) if isinstance(spec, str) else f'{factor}={level}'


def arm_label(declared, levels):
  """The short label of an arm with {factor: level} `levels` (platform aside): what differs from
  the reference ('BN/16', 'tpu_default, bf16 activations'); the reference arm is named by its
  first factor's level ('native')."""
  reference = declared.get('reference') or {}
  factors = [f for f in declared.get('factors') or levels if f != 'platform' and f in levels]
  differ = [f for f in factors if level_text(levels[f]) != level_text(reference.get(f))]
  if not differ:
    first = factors[0] if factors else None
    return factor_label(declared, first, level_text(levels[first])) if first else 'reference'
  return ', '.join(factor_label(declared, f, level_text(levels[f])) for f in differ)
