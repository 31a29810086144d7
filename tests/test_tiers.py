"""Every test file is in exactly one tier (tests/conftest.py TIERS), and `-m TIER` selects it."""

import collections
import pathlib

from tests import conftest


def test_every_test_file_has_exactly_one_tier():
  files = {p.relative_to(conftest.TESTS).as_posix() for p in conftest.TESTS.rglob('test_*.py')}
  listed = collections.Counter(f for names in conftest.TIERS.values() for f in names)
  assert not {f: n for f, n in listed.items() if n > 1}, 'a file in two tiers'
  assert files - set(listed) == set(), 'test files without a tier: add them to conftest.TIERS'
  assert set(listed) - files == set(), 'tiers list files that do not exist'


def test_the_tiers_are_the_registered_markers():
  ini = (conftest.TESTS.parent / 'pytest.ini').read_text()
  registered = [line.split(':')[0].strip() for line in ini.split('markers =')[1].splitlines()
                if ':' in line]
  assert registered == list(conftest.TIERS)


def test_a_file_gets_its_tier(request):
  assert conftest.tier_of(pathlib.Path(__file__)) == 'unit'
  assert conftest.tier_of(conftest.TESTS / 'gpu' / 'test_gpu_tier.py') == 'gpu'
  assert conftest.tier_of(conftest.TESTS / 'test_not_listed.py') is None
  assert request.node.get_closest_marker('unit') is not None
