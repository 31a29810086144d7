"""analysis/ by role (tests/test_imports.py checks that its rooms import downwards only): reading
happens in inputs/, the commands write, and numbers/ and words/ take tables and return tables and
text -- no file, stream or process I/O there, checked on the code itself (ast): no I/O module
imported, no builtin that reads or writes, no call of a reader or writer (pandas', numpy's, the run
record's, inputs/'s)."""

import ast
import glob
import os

from tests.conftest import ROOT

REPO = ROOT
ROOMS = ('numbers', 'words')
IO_MODULES = {
  'os',
  'io',
  'sys',
  'pathlib',
  'shutil',
  'glob',
  'tempfile',
  'pickle',
  'subprocess',
  'socket',
  'urllib',
  'etils',
  'orbax',
  'tensorflow',
  'h5py',
  'fcntl',
  'json',
  'matplotlib',
}
IO_BUILTINS = {'open', 'print', 'input', 'exec', 'eval', '__import__'}
# Readers and writers by the name they are called by: pandas and numpy files, paths, the run
# record (runrecord/record.py, predictions.py) and analysis/inputs/'s readers.
IO_CALLS = {
  'read_csv',
  'to_csv',
  'read_json',
  'to_json',
  'read_parquet',
  'to_parquet',
  'read_pickle',
  'to_pickle',
  'read_excel',
  'to_excel',
  'read_table',
  'to_latex_file',
  'savefig',
  'save',
  'savez',
  'load',
  'loadtxt',
  'savetxt',
  'genfromtxt',
  'fromfile',
  'tofile',
  'read_text',
  'write_text',
  'read_bytes',
  'write_bytes',
  'mkdir',
  'makedirs',
  'unlink',
  'listdir',
  'walk',
  'exists',
  'stdout',
  'stderr',
  'read_results',
  'write_results',
  'read_predictions',
  'saved_steps',
  'checkpoint_dir',
  'read',
  'read_runs',
  'read_columns',
  'read_file',
  'load_study',
  'load_runs',
  'load_steps',
  'steps_frame',
  'find_all',
  'read_all',
  'train_records',
  'open_root',
  'from_roots',
  'from_config',
  'write',
}


def io_uses(source, name='<source>'):
  """'FILE:LINE what' for each I/O use in the Python `source` (module doc)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    line = f'{name}:{getattr(node, "lineno", 0)}'
    if isinstance(node, ast.Import):
      found += [
        f'{line} imports {a.name}' for a in node.names if a.name.split('.')[0] in IO_MODULES
      ]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      if node.module.split('.')[0] in IO_MODULES:
        found.append(f'{line} imports from {node.module}')
    elif isinstance(node, ast.Call):
      func = node.func
      if isinstance(func, ast.Name) and func.id in IO_BUILTINS:
        found.append(f'{line} calls {func.id}()')
      elif isinstance(func, ast.Attribute) and func.attr in IO_CALLS:
        found.append(f'{line} calls .{func.attr}()')
    elif isinstance(node, ast.Attribute) and node.attr in ('stdout', 'stderr', 'stdin'):
      found.append(f'{line} uses .{node.attr}')
  return found


def room_files(room):
  return sorted(glob.glob(os.path.join(REPO, 'analysis', room, '*.py')))


def test_numbers_and_words_do_no_io():
  found = []
  for room in ROOMS:
    for path in room_files(room):
      with open(path, encoding='utf-8') as f:
        found += io_uses(f.read(), os.path.relpath(path, REPO))
  assert found == [], '\n'.join(found)
  assert len(room_files('numbers')) > 10 and len(room_files('words')) > 5


def test_the_check_finds_planted_io():
  planted = (
    'import os\nfrom etils import epath\nimport pandas as pd\n'
    'def f(path, table, runs):\n  open(path)\n  pd.read_csv(path)\n  table.to_csv(path)\n'
    '  run_predictions.read(runs)\n  results.load_study(runs)\n  print(table)\n'
    '  sys.stdout.write("x")\n'
  )
  assert io_uses(planted, 'x.py') == [
    'x.py:1 imports os',
    'x.py:2 imports from etils',
    'x.py:5 calls open()',
    'x.py:6 calls .read_csv()',
    'x.py:7 calls .to_csv()',
    'x.py:8 calls .read()',
    'x.py:9 calls .load_study()',
    'x.py:10 calls print()',
    'x.py:11 calls .write()',
    'x.py:11 uses .stdout',
  ]
  assert io_uses('import numpy as np\ndef g(x):\n  return np.mean(x) + len(str(x))\n') == []
