"""`make lint`'s checks (ruff format, ruff check, codespell, mypy; settings in pyproject.toml) each
fail on a planted violation and pass on the same file without it, and the three places that name
them agree: the Makefile's `lint` recipe, .pre-commit-config.yaml and requirements-lint.txt (the
pinned versions); .ci/run runs `make lint` before `make test`."""

import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

PYPROJECT = f'{ROOT}/pyproject.toml'
MISSPELT = 'te' + 'h'  # a word codespell knows as misspelt (spelt out, it would flag this file)
CLEAN = "import os\n\n\ndef home() -> str:\n  return os.environ.get('HOME', '')\n"
# (check, its command on one file, the planted file, the words its complaint must hold)
PLANTED = {
  'ruff format': (
    ['ruff', 'format', '--check', '--config', PYPROJECT],
    CLEAN.replace('  return', '    return'),  # 4-space indent: the project indents by 2
    'would be reformatted',
  ),
  'ruff check': (
    ['ruff', 'check', '--config', PYPROJECT],
    'import sys\n' + CLEAN,  # an unused import
    'F401',
  ),
  'ruff check (100 columns)': (
    ['ruff', 'check', '--config', PYPROJECT],
    CLEAN + f"\n\nWORDS = '{'x' * 100}'\n",
    'E501',
  ),
  'codespell': (['codespell_lib'], CLEAN.replace("'HOME'", "'HOME'  # " + MISSPELT), MISSPELT),
  'mypy': (
    ['mypy', '--config-file', PYPROJECT],
    CLEAN.replace("os.environ.get('HOME', '')", 'len(os.environ)'),  # int where str is declared
    'Incompatible return value type',
  ),
}


def run_check(command, path):
  return subprocess.run(
    [sys.executable, '-m', *command, str(path)],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=path.parent,
  )


@pytest.mark.parametrize('check', sorted(PLANTED))
def test_each_check_fails_on_a_planted_violation_and_passes_without_it(check, tmp_path):
  command, planted, complaint = PLANTED[check]
  clean_file, planted_file = tmp_path / 'clean.py', tmp_path / 'planted.py'
  clean_file.write_text(CLEAN)
  planted_file.write_text(planted)
  passed = run_check(command, clean_file)
  assert passed.returncode == 0, passed.stdout + passed.stderr
  failed = run_check(command, planted_file)
  assert failed.returncode != 0 and complaint in failed.stdout + failed.stderr, (
    failed.stdout + failed.stderr
  )


def lint_recipe():
  """The commands of the Makefile's `lint` target, without `$(PY) -m` (codespell's module is
  codespell_lib)."""
  with open(f'{ROOT}/Makefile') as f:
    recipe = f.read().split('\nlint:')[1].split('\n\n')[0].splitlines()[1:]
  commands = [line.strip().removeprefix('$(PY) -m ').split()[0:2] for line in recipe]
  return [['codespell'] if words == ['codespell_lib'] else words for words in commands]


def test_make_lint_precommit_and_the_pins_name_the_same_checks():
  assert lint_recipe() == [['ruff', 'format'], ['ruff', 'check'], ['codespell'], ['mypy']]
  with open(f'{ROOT}/.pre-commit-config.yaml') as f:
    hooks = [h for repo in yaml.safe_load(f)['repos'] for h in repo['hooks']]
  entries = [h['entry'].split()[:2] for h in hooks]
  assert entries == [['ruff', 'format'], ['ruff', 'check'], ['codespell'], ['mypy']]
  with open(f'{ROOT}/requirements-lint.txt') as f:
    pins = dict(re.findall(r'^([\w-]+)==(\S+)$', f.read(), re.M))
  hook_pins = {
    d.split('==')[0]: d.split('==')[1] for h in hooks for d in h.get('additional_dependencies', [])
  }
  assert hook_pins and all(pins[name] == version for name, version in hook_pins.items())
  assert set(pins) >= {'ruff', 'mypy', 'codespell'}


def test_ci_lints_before_it_tests():
  with open(f'{ROOT}/.ci/run') as f:
    commands = [line.strip() for line in f if line.strip().startswith('make ')]
  assert commands == ['make lint', 'make test']
