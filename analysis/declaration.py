"""A study's declaration, fixed before the first run (a config's get_study() or a study.json):
every key optional and checked (SCHEMA), its arms and levels present among the runs."""

import difflib
import importlib.util
import json
import math
import os
import sys
from typing import Any, Union

from etils import epath

from runrecord import record

STUDY_FILE = 'study.json'
DEFAULT_MARGIN = 0.5  # pp, where a study declares none
MIN_SHARE = 0.5  # the share of the gap the numerics part must reach, where none is declared
MAX_MARGIN = 100.0  # pp: a wider margin calls every accuracy difference equivalent
SEED_MAX = 2**32 - 1  # the PRNG's range (configs/validation.py SEED_MAX)
ARMS = ('reference', 'noise_arm', 'noise_of', 'native')  # the keys naming an arm {factor: level}


def column_names(name):
  """The columns `name` may mean, in order: as written, then with a numerics/config/final prefix."""
  prefixes = ('', record.ARM_PREFIX, 'numerics.effective.', record.CONFIG_PREFIX, 'final.')
  return [prefix + name for prefix in prefixes]


def resolve_column(frame, name, arg):
  """The column of `frame` that `name` means: exact, or with a numerics/config/final prefix."""
  for candidate in column_names(name):
    if candidate in frame.columns:
      return candidate
  shown = ', '.join(c for c in frame.columns if not c.startswith(('config.', 'versions.', 'data.')))
  raise ValueError(f'{arg}: no column {name!r}; choose from {shown} (or any config.* field)')


def margin_problem(value):
  """Why `value` is not an equivalence margin: a finite number in (0, MAX_MARGIN]."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return (
      f'{value!r} is not a number; give the margin as a number, e.g. 0.5 (pp for an '
      "accuracy, else the metric's units)"
    )
  if not 0 < value <= MAX_MARGIN:
    return (
      f'{value!r} is not a usable margin; give a number above 0 and at most {MAX_MARGIN:g} '
      "(pp for an accuracy, else the metric's units), e.g. 0.5"
    )
  return None


def check_margin(value, where):
  """`value` as a float margin, else a ValueError naming `where` (the flag or the study's field)."""
  problem = margin_problem(value)
  if problem:
    raise ValueError(f'{where}: {problem}')
  return float(value)


def text_problem(value):
  """Why `value` is not one line of text (it is printed inside a sentence of report.md)."""
  if not isinstance(value, str):
    return f'{value!r} is not text; write it in quotes'
  if value and value.splitlines() != [value]:
    return f'{value!r} holds a line break; write it on one line'
  return None


def real(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_problem(value):
  return (
    None if real(value) and value > 0 else f'{value!r} is not a positive number; give e.g. 1.0 (pp)'
  )


def share_problem(value):
  """Why `value` is not a share of the gap: a number in (0, 1]."""
  if real(value) and 0 < value <= 1:
    return None
  return f'{value!r} is not a share in (0, 1]; give e.g. 0.5 (half the gap), not a percent'


def whole(value):
  """Whether `value` is a whole number (6 or 6.0, not True, not 6.5)."""
  return real(value) and value == int(value)


def seeds_problem(value):
  """Why `value` is not a seed count k (seeds 0..k-1) or a list of distinct seeds."""
  if isinstance(value, list):
    bad = [s for s in value if not (whole(s) and 0 <= s <= SEED_MAX)]
    if not value or bad:
      return (
        f'{bad[0] if bad else value!r} is not a seed; give whole numbers in [0, {SEED_MAX}], '
        'e.g. [0, 1, 2, 3]'
      )
    repeated = sorted({int(s) for s in value if value.count(s) > 1})
    return f'seed {repeated[0]} is listed twice; list each seed once' if repeated else None
  if whole(value) and value >= 1:
    return None
  return (
    f'{value!r} is not a seed count; give a positive whole number k (seeds 0..k-1) or a '
    'list of seeds, e.g. [0, 1, 2, 3]'
  )


def factors_problem(value):
  if isinstance(value, str):
    return (
      f'{value!r} is text, not a list (it would be read letter by letter); write '
      f'[{json.dumps(value)}]'
    )
  if not isinstance(value, list) or not all(isinstance(f, str) and f.strip() for f in value):
    return f'{value!r} is not a list of factor names; write e.g. ["platform", "profile"]'
  repeated = [f for f in dict.fromkeys(value) if value.count(f) > 1]
  return f'{repeated[0]!r} is listed twice; list each factor once' if repeated else None


def pairs_of(value):
  """{factor: level} of an arm as written ({factor: level} or ['factor=level', ...]), else None."""
  if isinstance(value, dict):
    return value
  if isinstance(value, list) and all(isinstance(v, str) and '=' in v for v in value):
    return dict(str(v).split('=', 1) for v in value)
  return None


def arm_problem(value, single=False):
  """Why `value` is not an arm ({factor: level}, levels text or numbers; `single`: one factor)."""
  arm = pairs_of(value)
  example = '{"profile": "native"}'
  if not arm:
    return f'{value!r} is not an arm; give {{factor: level}}, e.g. {example}'
  bad = [
    f'{k}: {v!r}'
    for k, v in arm.items()
    if not (isinstance(k, str) and k) or isinstance(v, (dict, list, type(None)))
  ]
  if bad:
    return f'{bad[0]} is not factor: level (a level is text or a number); e.g. {example}'
  if single and len(arm) != 1:
    return f'{value!r} names {len(arm)} factors; the native arm is one factor=level, e.g. {example}'
  return None


def platform_profile_problem(value):
  if not isinstance(value, dict) or not value:
    return f'{value!r} is not {{platform: level}}; give e.g. {{"gpu": "jax_gpu_default"}}'
  bad = [
    f'{k}: {v!r}'
    for k, v in value.items()
    if not (isinstance(k, str) and k.strip() == k and k) or not isinstance(v, str) or not v
  ]
  return (
    f'{bad[0]} is not platform: profile level (both text), e.g. "gpu": "jax_gpu_default"'
    if bad
    else None
  )


def label_problem(spec):
  """Why a factor's label `spec` is neither a text formatting one level ('BN/{}') nor
  {level: label}, one label per level."""
  if isinstance(spec, dict):
    bad = [f'{k}: {v!r}' for k, v in spec.items() if not isinstance(v, str)]
    same = [k for k, v in spec.items() if list(spec.values()).count(v) > 1]
    if same and not bad:
      return f'levels {", ".join(map(str, same))} have one label; give each level its own'
    return f'{bad[0]} is not a label (text)' if bad else None
  if not isinstance(spec, str):
    return f'{spec!r} is neither a format text ("BN/{{}}") nor {{level: label}}'
  try:
    if spec.format('x') == spec.format('y'):
      return (
        f'{spec!r} gives every level one label; write {{}} where the level goes, e.g. "BN/{{}}"'
      )
  except (IndexError, KeyError, ValueError) as e:
    return (
      f'{spec!r} does not format one level ({type(e).__name__}: {e}); write {{}} where the '
      'level goes, e.g. "BN/{}"'
    )
  return None


def labels_problem(value):
  if not isinstance(value, dict):
    return f'{value!r} is not {{factor: label}}; give e.g. {{"batchnorm_group": "BN/{{}}"}}'
  for factor, spec in value.items():
    problem = label_problem(spec)
    if problem:
      return f'{factor}: {problem}'
  return None


def compare_problem(value):
  """Why `value` is not a non-empty list of pairs of two different platforms, each pair once."""
  example = 'e.g. [["tpu", "gpu"], ["tpu", "cpu"]]'
  if not isinstance(value, (list, tuple)) or not value:
    return f'{value!r} is not a list of platform pairs; give {example}'
  seen = set()
  for pair in value:
    if (
      not isinstance(pair, (list, tuple))
      or len(pair) != 2
      or not all(isinstance(p, str) and p for p in pair)
    ):
      return f'{pair!r} is not a pair of platform names; give {example}'
    if pair[0] == pair[1]:
      return f'{list(pair)!r} compares {pair[0]} with itself; give two different platforms'
    if frozenset(pair) in seen:
      return f'{list(pair)!r} is given twice (in either order); give each pair once'
    seen.add(frozenset(pair))
  return None


def device_kinds_problem(value):
  """Why `value` is no way to analyse a platform's runs on several device kinds (None: it is)."""
  if value in ('split', 'blocked'):
    return None
  return (
    f"{value!r}: give 'split' (each device kind a platform of its own, the default) or 'blocked' "
    '(one platform, each seed the mean over its kinds, the kind effect stated)'
  )


def parse_compare(items):
  """--compare A:B [C:D ...] as [[A, B], ...] (None when not given)."""
  if not items:
    return None
  pairs = [str(item).split(':') for item in items]
  bad = next((item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2), None)
  problem = (
    f'{bad!r} is not A:B; write e.g. --compare tpu:gpu tpu:cpu'
    if bad is not None
    else compare_problem(pairs)
  )
  if problem:
    raise ValueError(f'--compare: {problem}')
  return pairs


def pairs_text(pairs):
  """'tpu − gpu, gpu − cpu'."""
  return ', '.join(f'{a} − {b}' for a, b in pairs)


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
  'device_kinds': device_kinds_problem,
  'min_share': share_problem,
  'min_share_reason': text_problem,
  'labels': labels_problem,
  'seed_sd': positive_problem,
  'paired_sd': positive_problem,
  'seeds': seeds_problem,
  'seed_sd_source': text_problem,
  'paired_sd_source': text_problem,
}


def problems(declared):
  """['key: why', ...]: every unknown key, every value of the wrong type or range."""
  lines = []
  for key in (k for k in declared if k not in SCHEMA):
    close = difflib.get_close_matches(str(key), SCHEMA, n=1, cutoff=0.6)
    near = f'did you mean {close[0]!r}?' if close else f'the keys: {", ".join(SCHEMA)}'
    lines.append(f'{key!r} is not a declaration key; {near}')
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
  """The declaration, or a ValueError of one line per problem naming `where` and the key."""
  lines = problems(declared)
  if lines:
    raise ValueError('\n'.join(f'{where}: {line}' for line in lines))
  return declared


def declared_seeds(declared):
  """The declared seeds in order (0..k-1 for a count k), None when it names none."""
  seeds = (declared or {}).get('seeds')
  if seeds is None:
    return None
  return [int(s) for s in seeds] if isinstance(seeds, list) else list(range(int(seeds)))


def level_problems(declared, frame):
  """['key: why', ...]: each declared factor that is no column of the runs."""
  factors = [f for f in declared.get('factors') or []]
  found, lines = {}, []
  for factor in factors:
    try:
      found[factor] = resolve_column(frame, factor, 'factors')
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
  """A ValueError of one line per level_problems line, each naming `where`."""
  lines = level_problems(declared or {}, frame)
  if lines:
    raise ValueError('\n'.join(f'{where}: {line}' for line in lines))


def normalise(declared):
  """The declaration as JSON reads it back (tuples as lists, keys as text)."""
  return json.loads(json.dumps(declared or {}, sort_keys=True))


def from_config(spec):
  """The get_study(arg) dict of the config file in `spec` ('FILE[:ARG]'); {} without get_study."""
  cut = spec.find('.py:')
  path, arg = (spec[: cut + 3], spec[cut + 4 :]) if cut >= 0 else (spec, '')
  if not os.path.isfile(path):  # configs/x.py from any folder: the project's own
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)
  if not path.endswith('.py') or not os.path.isfile(path):
    raise ValueError(f'--study: no config file {path}; give a study.json or a FILE.py[:ARG]')
  home = os.path.dirname(os.path.dirname(os.path.abspath(path)))  # the repository of configs/X.py
  if home not in sys.path:
    sys.path.insert(0, home)
  name = f'study_{os.path.splitext(os.path.basename(path))[0]}'
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
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
  """A declaration written as JSON (a byte-order mark read past, a key given twice refused)."""
  try:
    declared = json.loads(
      epath.Path(path).read_bytes().decode('utf-8-sig'), object_pairs_hook=unique_keys
    )
  except (OSError, ValueError) as e:
    raise ValueError(
      f'--study: cannot read {path} as a study declaration ({e}); give a '
      f'{STUDY_FILE} or a config file with get_study()'
    ) from e
  if not isinstance(declared, dict):
    raise ValueError(
      f'--study: {path} holds no declaration (a JSON object); see docs/statistics.md'
    )
  return check(declared, str(path))


def load(source: Union[str, os.PathLike[str]]) -> dict[str, Any]:
  """The declaration in a .json file or a config spec 'FILE[:ARG]' (get_study)."""
  return read_file(source) if str(source).lower().endswith('.json') else from_config(source)


def differences(saved, declared):
  """['margin: 2.0 -> 1.0', ...]: the keys in which `declared` differs from `saved`."""
  saved, declared = normalise(saved), normalise(declared)
  return [
    f'{k}: {json.dumps(saved.get(k))} -> {json.dumps(declared.get(k))}'
    for k in sorted(set(saved) | set(declared))
    if saved.get(k) != declared.get(k)
  ]


def from_roots(roots):
  """(declaration, where) from the roots' STUDY_FILE: ({}, None) when none has one."""
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
  """An arm's short label: what differs from the reference ('BN/16')."""
  reference = declared.get('reference') or {}
  factors = [f for f in declared.get('factors') or levels if f != 'platform' and f in levels]
  differ = [f for f in factors if level_text(levels[f]) != level_text(reference.get(f))]
  if not differ:
    first = factors[0] if factors else None
    return factor_label(declared, first, level_text(levels[first])) if first else 'reference'
  return ', '.join(factor_label(declared, f, level_text(levels[f])) for f in differ)
