"""Every test file sits directly in one tier folder (tests/unit, tests/integration, tests/e2e,
tests/tpu, tests/gpu: tests/conftest.py TIERS), its tests carry the tier as a marker, and the
markers are the ones pytest.ini registers."""

from tests import conftest


def test_every_test_file_is_in_a_tier_folder():
  assert conftest.outside_the_tiers() == [], (
      'move these into the folder of their tier (tests/conftest.py says which is which)')
  for tier in conftest.TIERS:
    assert list((conftest.TESTS / tier).glob('test_*.py')), f'tests/{tier}: no test file'


def test_a_test_file_outside_the_tier_folders_is_found(tmp_path):
  """The rule above on a planted tree: a file at the top of tests/, one folder too deep, in the
  helpers' package or in a folder that is no tier is outside; one in a tier folder is not."""
  planted = ['test_top.py', 'unit/test_fine.py', 'e2e/test_fine_too.py', 'unit/deeper/test_deep.py',
             'support/test_helper.py', 'slow/test_x.py', 'unit/checks_test.py', 'unit/helpers.py']
  for name in planted:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('')
  assert conftest.outside_the_tiers(tmp_path) == [
      'slow/test_x.py', 'support/test_helper.py', 'test_top.py', 'unit/deeper/test_deep.py']
  assert conftest.tier_of(tmp_path / 'e2e' / 'test_fine_too.py', tmp_path) == 'e2e'
  assert conftest.tier_of(tmp_path / 'test_top.py', tmp_path) is None


def test_the_tiers_are_the_registered_markers():
  ini = (conftest.TESTS.parent / 'pytest.ini').read_text()
  registered = [line.split(':')[0].strip() for line in ini.split('markers =')[1].splitlines()
                if ':' in line]
  assert registered == list(conftest.TIERS)
  assert 'python_files' not in ini  # conftest.TEST_FILES are pytest's defaults


def test_a_file_gets_its_folders_tier(request):
  assert conftest.tier_of(__file__) == 'unit'
  assert conftest.tier_of(conftest.TESTS / 'gpu' / 'test_gpu_tier.py') == 'gpu'
  assert request.node.get_closest_marker('unit') is not None
  assert [m.name for m in request.node.iter_markers() if m.name in conftest.TIERS] == ['unit']

