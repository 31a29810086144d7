"""Every test file sits directly in one tier folder (tests/unit, tests/integration, tests/e2e,
tests/tpu, tests/gpu: tests/conftest.py TIERS), its tests carry the tier as a marker, and the
markers are the ones pyproject.toml registers for pytest; what tests share lives in tests/support
(no test file imports another)."""

import ast
import pathlib
import tomllib

from tests import conftest


def test_every_test_file_is_in_a_tier_folder():
  assert conftest.outside_the_tiers() == [], (
    'move these into the folder of their tier (tests/conftest.py says which is which)'
  )
  for tier in conftest.TIERS:
    assert list((conftest.TESTS / tier).glob('test_*.py')), f'tests/{tier}: no test file'


def test_a_test_file_outside_the_tier_folders_is_found(tmp_path):
  """The rule above on a planted tree: a file at the top of tests/, one folder too deep, in the
  helpers' package or in a folder that is no tier is outside; one in a tier folder is not."""
  planted = [
    'test_top.py',
    'unit/test_fine.py',
    'e2e/test_fine_too.py',
    'unit/deeper/test_deep.py',
    'support/test_helper.py',
    'slow/test_x.py',
    'unit/checks_test.py',
    'unit/helpers.py',
  ]
  for name in planted:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('')
  assert conftest.outside_the_tiers(tmp_path) == [
    'slow/test_x.py',
    'support/test_helper.py',
    'test_top.py',
    'unit/deeper/test_deep.py',
  ]
  assert conftest.tier_of(tmp_path / 'e2e' / 'test_fine_too.py', tmp_path) == 'e2e'
  assert conftest.tier_of(tmp_path / 'test_top.py', tmp_path) is None


def test_the_tiers_are_the_registered_markers():
  with open(conftest.TESTS.parent / 'pyproject.toml', 'rb') as f:
    pytest_config = tomllib.load(f)['tool']['pytest']['ini_options']
  registered = [marker.split(':')[0].strip() for marker in pytest_config['markers']]
  assert registered == list(conftest.TIERS)
  assert 'python_files' not in pytest_config  # conftest.TEST_FILES are pytest's defaults


def test_a_file_gets_its_folders_tier(request):
  assert conftest.tier_of(__file__) == 'unit'
  assert conftest.tier_of(conftest.TESTS / 'gpu' / 'test_gpu_tier.py') == 'gpu'
  assert request.node.get_closest_marker('unit') is not None
  assert [m.name for m in request.node.iter_markers() if m.name in conftest.TIERS] == ['unit']


def imported_test_modules(path):
  """The test modules (test_*.py) a file imports: what it shares belongs in tests/support."""
  tree = ast.parse(pathlib.Path(path).read_text(encoding='utf-8'))
  names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  names += [
    f'{n.module}.{a.name}' if n.module else a.name
    for n in ast.walk(tree)
    if isinstance(n, ast.ImportFrom)
    for a in n.names
  ]
  names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
  return sorted({m for m in names if any(part.startswith('test_') for part in m.split('.'))})


def test_no_test_file_imports_another():
  shared = {
    p.relative_to(conftest.TESTS).as_posix(): imported_test_modules(p)
    for p in conftest.TESTS.rglob('*.py')
  }
  assert {f: m for f, m in shared.items() if m} == {}, 'move what they share into tests/support'


def test_the_import_check_sees_each_spelling(tmp_path):
  path = tmp_path / 'test_x.py'
  path.write_text(
    'import test_a\nfrom test_b import f\nfrom tests.unit.test_c import g\n'
    'from tests.unit import test_d\nfrom tests.support.planted_runs import smoke\n'
    'def h():\n  from test_e import k\n'
  )
  assert imported_test_modules(path) == [
    'test_a',
    'test_b',
    'test_b.f',
    'test_e',
    'test_e.k',
    'tests.unit.test_c',
    'tests.unit.test_c.g',
    'tests.unit.test_d',
  ]
