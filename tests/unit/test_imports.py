"""The import structure: folders form layers (no back-edges, no cycles), and so do files; one
config resolution path, no private JAX module and no fault hook in production code.

  python tests/unit/test_imports.py     # prints the folder-level import arrows and the layers

Read from the code itself (ast), so the picture cannot drift from it.
"""

import collections
import subprocess
import sys

from tests.support.import_graph import REPO, graphs, layers


def test_folders_form_layers_without_back_edges():
  _, folders = graphs()
  order = [f for layer in layers(folders) for f in layer]
  assert order.index('trainer') > max(order.index(f) for f in ('numerics', 'models', 'configs'))
  for reader in ('experiments', 'benchmarks', 'sweeps', 'train'):
    assert order.index(reader) > order.index('trainer')
  assert order.index('analysis') > order.index('runrecord')
  assert 'analysis' not in folders['trainer'] and 'experiments' not in folders['analysis']
  # analysis/ only reads results: it neither launches training nor runs experiments, and it reads
  # runs through the run record's own room, not through the trainer
  assert not {'sweeps', 'experiments', 'train', 'trainer'} & folders['analysis']
  assert order.index('runrecord') < order.index('trainer')
  assert not {'trainer', 'analysis', 'sweeps', 'models', 'input_pipeline'} & folders['runrecord']


# analysis/ by role: inputs (reading runs) < numbers (the typed result) < words, figures < the
# commands (analysis/*.py: analyse, attribute, draw, export, findings, and their cli helpers).
ANALYSIS_ROOMS = ('inputs', 'numbers', 'words', 'figures')


def analysis_room(module):
  """The room of an analysis module: inputs, numbers, words, figures, or 'commands'."""
  parts = module.split('.')
  return parts[1] if len(parts) > 2 and parts[1] in ANALYSIS_ROOMS else 'commands'


def test_analysis_rooms_by_role_import_downwards_only():
  files, _ = graphs()
  arrows = collections.defaultdict(set)
  for module, targets in files.items():
    if module.startswith('analysis.'):
      for target in targets:
        if target.startswith('analysis.') and analysis_room(target) != analysis_room(module):
          arrows[analysis_room(module)].add(analysis_room(target))
  assert not arrows['inputs'], arrows['inputs']
  assert arrows['numbers'] <= {'inputs'}, arrows['numbers']
  assert arrows['words'] <= {'inputs', 'numbers'}, arrows['words']
  assert arrows['figures'] <= {'inputs', 'numbers'}, arrows['figures']
  # nothing outside analysis/ reaches into its commands but benchmarks and sweeps (which run them),
  # and the package's __init__ (it parses a command's flags before the command's imports)
  for module, targets in files.items():
    commands = {t for t in targets if t.startswith('analysis.') and analysis_room(t) == 'commands'}
    if (
      commands
      and module != 'analysis'
      and not module.startswith(('analysis.', 'benchmarks.', 'sweeps.'))
    ):
      raise AssertionError(f'{module} imports the analysis commands {sorted(commands)}')


def test_no_file_imports_itself_through_others():
  files, _ = graphs()
  layers(files)  # raises ValueError naming the files of any cycle


def grep(pattern):
  """{file: [line, ...]} of `git grep -nE pattern` in the project's Python files outside tests/."""

  out = subprocess.run(
    ['git', 'grep', '-nE', pattern, '--', '*.py', ':!tests/'],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
  ).stdout
  found = collections.defaultdict(list)
  for line in out.splitlines():
    path, _, rest = line.partition(':')
    found[path].append(rest)
  return dict(found)


def test_one_config_resolution_path():
  """The numerics formats are expanded and the fields checked in one place only
  (configs/validation.py resolve); the removed `emulate` field lives only in the one-line hint and
  the mapping of old records; no private JAX module and no fault hook in production code."""
  assert list(grep(r'profiles\.expand\(|check_numerics\(')) == ['configs/validation.py']
  assert sorted(grep(r"numerics\.emulate\b|'emulate'")) == [
    'configs/common.py',
    'numerics/profiles.py',
  ]
  assert grep(r'jax\._src') == {}
  assert grep(r'\bfaults\b|TRAIN_FAULT') == {}


if __name__ == '__main__':
  files_graph, folder_graph = graphs()
  for source in sorted(folder_graph):
    print(f'{source} -> {", ".join(sorted(folder_graph[source])) or "(nothing)"}')
  print('layers, bottom up:', ' | '.join(', '.join(layer) for layer in layers(folder_graph)))
  print(f'{len(files_graph)} files, {sum(map(len, folder_graph.values()))} folder arrows')
  sys.exit(0)
