"""A study's declaration: what its analysis tests, fixed before the first run.

A config file's `get_study(arg=None)` returns it as a dict; every key is optional:
  margin, margin_reason     the equivalence margin (pp) and why
  factors                   the factors that define the arms (platform included)
  reference                 {factor: level}: the reference arm every other arm is compared with
  noise_arm                 {factor: level}: the noise control
  noise_of                  {factor: level}: the arm the noise control perturbs (the noise floor
                            is the paired sd of their difference; default: the reference arm)
  min_share, min_share_reason  the share of the platform gap the numerics part must reach (lower
                            95% bound) for "explained by numerics" (analysis/numbers/gap_verdict.py)
  native, platform_profile  the native arm and the profile emulating each platform (the gap
                            decomposition, analysis/numbers/gap.py)
  labels                    {factor: '{}'-format text or {level: label}}: short arm labels
  seed_sd, paired_sd, seeds and their *_source: the power calculation behind the seed count
sweeps.sweep (and so sweeps.run_study) writes it into the root as STUDY_FILE before the first run and
refuses a changed declaration once runs exist; the analysis reads it from there, so its tests are
the ones declared before the data existed (analysis/numbers/contrasts.py).

  declared = load('configs/digits.py:study')          # a config file, or a study.json file
  declared = from_roots(['runs/cpu', 'gs://b/gpu'])   # the roots' study.json (they must agree)
"""

import json

from etils import epath

STUDY_FILE = 'study.json'
# The defaults where a study declares none (light here, so that the commands' --help needs no
# statistics library): the equivalence margin, pp (analysis.numbers.stats), and the share of the
# gap the numerics part must reach (analysis.numbers.gap_verdict).
DEFAULT_MARGIN = 0.5
MIN_SHARE = 0.5
# The largest margin taken: in pp an accuracy difference never exceeds 100, so a wider margin
# calls every difference equivalent (inf, 1e308: "-12.92 pp equivalent").
MAX_MARGIN = 100.0


def margin_problem(value):
  """Why `value` is not an equivalence margin (None when it is one): a margin is a number (not
  text, not true/false), finite, above 0 and at most MAX_MARGIN."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return (f'{value!r} is not a number; give the margin as a number, e.g. 0.5 (pp for an '
            "accuracy, else the metric's units)")
  if not 0 < value <= MAX_MARGIN:
    return (f'{value!r} is not a usable margin; give a number above 0 and at most {MAX_MARGIN:g} '
            "(pp for an accuracy, else the metric's units), e.g. 0.5")
  return None


def check_margin(value, where):
  """`value` as a float when it is a margin (margin_problem), else a ValueError naming `where` (the
  flag, or the study.json path and field it came from)."""
  problem = margin_problem(value)
  if problem:
    raise ValueError(f'{where}: {problem}')
  return float(value)


def check(declared, where):
  """The declaration, its margin checked (check_margin, naming `where`: 'FILE: margin')."""
  if declared.get('margin') is not None:
    check_margin(declared['margin'], f'{where}: margin')
  return declared


def normalise(declared):
  """The declaration as JSON reads it back (tuples as lists, keys as text)."""
  return json.loads(json.dumps(declared or {}, sort_keys=True))


def from_config(spec):
  """The get_study(arg) dict of the config file in `spec` ('FILE[:ARG]'); {} without get_study."""
  from configs import loader  # pylint: disable=import-outside-toplevel
  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  declared = module.get_study(arg or None) if hasattr(module, 'get_study') else {}
  if not isinstance(declared, dict):
    raise ValueError(f'{path}: get_study() must return a dict (margin, factors, reference, ...)')
  return check(normalise(declared), f'{spec} get_study()')


def read_file(path):
  """A declaration written as JSON (a root's STUDY_FILE)."""
  try:
    declared = json.loads(epath.Path(path).read_bytes().decode('utf-8'))
  except (OSError, ValueError) as e:
    raise ValueError(f'--study: cannot read {path} as a study declaration ({e}); give a '
                     f'{STUDY_FILE} or a config file with get_study()') from None
  if not isinstance(declared, dict):
    raise ValueError(f'--study: {path} holds no declaration (a JSON object); see analysis/inputs/declaration.py')
  return check(declared, str(path))


def load(source):
  """The declaration in `source`: a .json file, or a config spec 'FILE[:ARG]' (get_study)."""
  return read_file(source) if str(source).endswith('.json') else from_config(source)


def add_study_argument(parser):
  """The --study flag of the commands that read a declaration."""
  parser.add_argument('--study', default=None,
                      help="the study's declaration: a study.json, or a config file with "
                           'get_study() (default: the study.json in the roots)')


def differences(saved, declared):
  """['margin: 2.0 -> 1.0', ...]: the keys in which `declared` differs from `saved`."""
  saved, declared = normalise(saved), normalise(declared)
  return [f'{k}: {json.dumps(saved.get(k))} -> {json.dumps(declared.get(k))}'
          for k in sorted(set(saved) | set(declared)) if saved.get(k) != declared.get(k)]


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
      raise ValueError(f'--runs: {found[0][0]} and {path} declare different studies '
                       f'({"; ".join(diff[:2])}); analyse them apart, or give --study')
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
