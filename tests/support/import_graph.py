"""The project's import graph read from its code (ast): modules, their project imports, folders and
topological layers (tests/unit/test_imports.py, tests/integration/test_config_owner.py)."""

import ast
import collections
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = (
  'configs',
  'numerics',
  'input_pipeline',
  'models',
  'runrecord',
  'trainer',
  'analysis',
  'benchmarks',
  'experiments',
  'sweeps',
)
TOP_FILES = ('train.py',)


def source_files():
  """{module name: path} of every project module outside tests/ (subpackages included)."""
  out = {}
  for folder in FOLDERS:
    for where, _, names in sorted(os.walk(os.path.join(REPO, folder))):
      package = os.path.relpath(where, REPO).replace(os.sep, '.')
      for name in sorted(n for n in names if n.endswith('.py')):
        module = f'{package}.{name[:-3]}' if name != '__init__.py' else package
        out[module] = os.path.join(where, name)
  for name in TOP_FILES:
    out[name[:-3]] = os.path.join(REPO, name)
  return out


def imports(path, modules):
  """Project modules that the file at `path` imports (at any depth of the file)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from pkg import mod` imports pkg.mod (a package's __init__ only when a name is not a
      # module)
      subs = [f'{node.module}.{a.name}' for a in node.names]
      names = subs if all(n in modules for n in subs) else [node.module] + subs
    else:
      continue
    found.update(n for n in names if n in modules)
  return found


def folder(module):
  return module.split('.')[0]


def graphs():
  """(file graph, folder graph): {module: set of imported modules} and the same per folder."""
  modules = source_files()
  files = {m: imports(p, modules) - {m} for m, p in modules.items()}
  folders = collections.defaultdict(set)
  for module, targets in files.items():
    folders[folder(module)].update(folder(t) for t in targets if folder(t) != folder(module))
  return files, dict(folders)


def layers(graph):
  """Topological layers (what imports nothing left first); raises ValueError on a cycle."""
  remaining = {k: set(v) for k, v in graph.items()}
  out = []
  while remaining:
    ready = sorted(k for k, v in remaining.items() if not v & set(remaining))
    if not ready:
      raise ValueError(f'import cycle: {" -> ".join(cycle(remaining))}')
    out.append(ready)
    for k in ready:
      del remaining[k]
  return out


def cycle(graph):
  """One cycle of `graph` (every node has an edge inside it), as a list of nodes."""
  node, path = sorted(graph)[0], []
  while node not in path:
    path.append(node)
    node = sorted(graph[node] & set(graph))[0]
  return path[path.index(node) :] + [node]
