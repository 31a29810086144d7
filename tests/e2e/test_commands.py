"""Every command's --help and a bad flag are answered before the heavy libraries load, and its help
is whole: a description that ends its sentence, help for every option.

Each command runs as a user runs it (`python -m X --help`, `python train.py --help`) under
`python -X importtime`, whose report on stderr names every module the process imported: a top-level
package among HEAVY fails the test. Not timed: what is checked here is what loads.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PACKAGES = (
  'analysis',
  'sweeps',
  'benchmarks',
  'experiments',
  'trainer',
  'numerics',
  'configs',
  'runrecord',
  'models',
  'input_pipeline',
)


def commands():
  """train.py and every module with a `__main__` block: the commands users run."""
  found = ['train.py']
  for folder in PACKAGES:
    for where, _, names in os.walk(os.path.join(ROOT, folder)):
      for name in sorted(names):
        path = os.path.join(where, name)
        if name.endswith('.py') and "__name__ == '__main__'" in open(path, encoding='utf-8').read():
          found.append(os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.'))
  return found


COMMANDS = commands()
HEAVY = (
  'jax',
  'jaxlib',
  'flax',
  'optax',
  'orbax',
  'matplotlib',
  'pandas',
  'scipy',
  'statsmodels',
  'torch',
  'tensorflow',
  'sklearn',
)


def run(command, *args):
  """(exit code, stdout, top-level packages imported) of `command args` under -X importtime."""
  target = [command] if command.endswith('.py') else ['-m', command]
  proc = subprocess.run(
    [sys.executable, '-X', 'importtime', *target, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, 'PYTHONPATH': ROOT},
  )
  imported = {
    line.rsplit('|', 1)[-1].strip().split('.')[0]
    for line in proc.stderr.splitlines()
    if line.startswith('import time:')
  }
  messages = [line for line in proc.stderr.splitlines() if not line.startswith('import time:')]
  return proc.returncode, proc.stdout, imported, messages


@pytest.fixture(scope='module')
def helps():
  return {command: run(command, '--help') for command in COMMANDS}


@pytest.mark.parametrize('command', COMMANDS)
def test_help_loads_no_heavy_library(helps, command):
  code, out, imported, _ = helps[command]
  assert code == 0 and out.strip(), command
  assert sorted(imported & set(HEAVY)) == [], command


@pytest.mark.parametrize('command', COMMANDS)
def test_a_bad_flag_is_refused_before_any_heavy_library(command):
  code, _, imported, messages = run(command, '--no-such-flag')
  assert code == 2 and 'Traceback' not in '\n'.join(messages), (command, messages[-5:])
  assert any('error' in line for line in messages), (command, messages[-5:])
  assert sorted(imported & set(HEAVY)) == [], command


def description(out):
  """The help's first paragraph after the usage block (argparse), or the docstring (train.py)."""
  paragraphs = [p.strip() for p in out.split('\n\n') if p.strip()]
  first = 1 if paragraphs[0].startswith('usage:') else 0
  return ' '.join(paragraphs[first].split())


def undocumented_options(out):
  """argparse option lines (in its options section) followed by no help text."""
  section = out.split('options:', 1)[-1] if 'options:' in out else ''
  lines = section.splitlines()
  missing = []
  for i, line in enumerate(lines):
    if not re.match(r'^  -', line):
      continue
    has_text = re.match(r'^  (-\S+(?: [A-Z_]+(?: \.\.\.\]?)?)?(?:, )?)+\s{2,}\S', line)
    continued = i + 1 < len(lines) and re.match(r'^\s{8,}\S', lines[i + 1])
    if not has_text and not continued:
      missing.append(line.strip())
  return missing


@pytest.mark.parametrize('command', COMMANDS)
def test_help_is_whole_and_documents_every_option(helps, command):
  """No description cut mid-sentence (`__doc__.split('\\n')[0]` gave 'its tables, the'), every
  option with its help (attribute's --metric and --seed-col had none)."""
  _, out, _, _ = helps[command]
  assert description(out)[-1] in '.)', (command, description(out)[-80:])
  assert undocumented_options(out) == [], command
