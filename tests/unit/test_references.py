"""Every module, file and test the prose names exists: the docs (README.md, BENCHMARKS.md,
results/README.md, docs/*.md) and every docstring and comment of the repository's Python files,
read for references of four shapes, each resolved against the tree:

  paths    a top-level folder's file or folder ('analysis/numbers/stats.py', 'docs/tpu.md',
           'input_pipeline/celeba*.py' as a glob), a module without its .py, or a module and one
           of its names ('runrecord/predictions.read_predictions')
  modules  a package's dotted module and at most one name in it ('analysis.numbers.stats',
           'analysis.inputs.csv_input.read_csv', 'sweeps.run_study')
  tests    'tests/test_x.py', 'test_x.py' or another file of tests/ ('tests/conftest.py'), found
           by file name anywhere under tests/ (the tiers' folders and the helpers' included)
  sections a page and one of its headings, quoted (docs/record.md "Test predictions")

Not references: example names (a part that is one letter or in capitals: 'analysis.x',
'configs/x.py', 'benchmarks.NAME'), file names after a dot ('numerics.md'), and `numerics.NAME`
where NAME is no module of numerics/ (the config's and the record's numerics fields share the
package's name: numerics.profile, numerics.requested). HISTORY lists references kept on purpose.
"""

import ast
import glob
import io
import os
import re
import tokenize

from tests.conftest import ROOT

REPO = ROOT
PACKAGES = (
  'analysis',
  'benchmarks',
  'configs',
  'experiments',
  'input_pipeline',
  'models',
  'numerics',
  'runrecord',
  'sweeps',
  'tests',
  'trainer',
)
FOLDERS = PACKAGES + ('docs', 'results', '.ci')
DOCS = ('README.md', 'BENCHMARKS.md', os.path.join('results', 'README.md'))
SKIP_DIRS = {'.git', '.venv', 'venv', 'shared', '__pycache__', '.jax_cache', 'node_modules'}
EXTENSIONS = ('md', 'json', 'csv', 'py', 'txt', 'yaml', 'toml', 'png', 'pdf', 'sh', 'jsonl')
FIELD_GROUPS = ('numerics',)  # packages whose name is also a config / record field group
# (file, reference): kept on purpose, with why.
HISTORY = {
  (
    'results/README.md',
    'analysis.study',
  ): 'the provenance of the shipped runs: the command as it was run (the README names its '
  'successor, sweeps.run_study)'
}

_PATH = re.compile(r'(?<![\w/.\-])((?:%s)/[\w/.*\-]*[\w*/])' % '|'.join(map(re.escape, FOLDERS)))
_DOTTED = re.compile(r'(?<![\w/.\-])((?:%s)(?:\.\w+)+)' % '|'.join(PACKAGES))
_TEST = re.compile(r'(?<![\w.\-])((?:[\w]+/)*test_\w+\.py)\b')
_SECTION = re.compile(r'\b(docs/[\w\-]+\.md|BENCHMARKS\.md|README\.md) "([^"]+)"')


def example_name(part):
  """A stand-in, not a name: one letter, or capitals ('x', 'X', 'NAME', 'FILE')."""
  return len(part) == 1 or (part.isupper() and part.isalpha())


def prose_lines(path):
  """(line number, text) of the prose of the file at `path`: every line of a Markdown file; the
  docstrings and comments of a Python file."""
  with open(path, encoding='utf-8') as f:
    source = f.read()
  if path.endswith('.md'):
    return list(enumerate(source.splitlines(), 1))
  lines = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      first = node.body[0] if node.body else None
      if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
      ):
        lines += [(first.lineno + i, text) for i, text in enumerate(first.value.value.splitlines())]
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  lines += [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]
  return lines


def top_names(path):
  """The names the module at `path` defines at its top level (functions, classes, assignments,
  imports)."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read())
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split('.')[0] for a in node.names)
  return names


def module_file(root, parts):
  """The file of the module `parts` under `root` (a .py or a package's __init__.py), or None."""
  base = os.path.join(root, *parts)
  for path in (base + '.py', os.path.join(base, '__init__.py')):
    if os.path.isfile(path):
      return path
  return None


def dotted_problem(root, ref):
  """Why the dotted reference `ref` does not resolve under `root` (None: it does, or it is no
  reference: module doc)."""
  parts = ref.split('.')
  if parts[-1] in EXTENSIONS or any(example_name(p) for p in parts):
    return None
  if parts[0] in FIELD_GROUPS and not module_file(root, parts[:2]):
    return None
  for k in range(len(parts), 0, -1):
    path = module_file(root, parts[:k])
    if path:
      if k == len(parts) or parts[k] in top_names(path):
        return None
      return f'{".".join(parts[:k])} defines no {parts[k]}'
  return 'no such module'


def path_problem(root, ref):
  """Why the path reference `ref` does not resolve under `root` (module doc), or None."""
  ref = ref.rstrip('/.')
  parts = re.split(r'[/.]', ref)
  if any(example_name(p) for p in parts if p) or '<' in ref:
    return None
  target = os.path.join(root, ref)
  if '*' in ref:
    return None if glob.glob(target) else 'nothing matches'
  if any(os.path.exists(target + ext) for ext in ('', '.py', '.md')):
    return None
  base, _, name = ref.rpartition('.')
  if base and os.path.isfile(os.path.join(root, base + '.py')) and '/' not in name:
    return (
      None
      if name in top_names(os.path.join(root, base + '.py'))
      else f'{base}.py defines no {name}'
    )
  return 'no such file or folder'


def unresolved_test_file(root, ref):
  """Why the file `ref` of tests/ is not there: looked for by its name anywhere under tests/ (the
  tiers' folders, the helpers' package), so that a reference survives the file's move."""
  name = os.path.basename(ref)
  if example_name(name[len('test_') : -len('.py')] if name.startswith('test_') else name[:-3]):
    return None
  found = glob.glob(os.path.join(root, 'tests', '**', name), recursive=True)
  return None if found else 'no such file under tests/'


def section_problem(root, page, heading):
  """Why `page` "heading" names no heading of that page (a module docstring's pointer), or None."""
  path = os.path.join(root, page)
  if not os.path.isfile(path):
    return None  # the page itself: path_problem
  with open(path, encoding='utf-8') as f:
    headings = re.findall(r'^#+\s+(.*?)\s*$', f.read(), re.M)
  return None if heading in headings else f'{page} has no heading "{heading}"'


def sources(root):
  """The files whose prose is read: the docs and every Python file of the tree."""
  found = [os.path.join(root, d) for d in DOCS if os.path.exists(os.path.join(root, d))]
  found += sorted(glob.glob(os.path.join(root, 'docs', '*.md')))
  for where, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith('.'))
    found += [os.path.join(where, n) for n in sorted(names) if n.endswith('.py')]
  return found


def stale_references(root):
  """'FILE:LINE: REFERENCE (why)' for every reference of the prose under `root` that does not
  resolve (module doc)."""
  stale = []
  for path in sources(root):
    name = os.path.relpath(path, root)
    for line, text in prose_lines(path):
      found = [(ref, unresolved_test_file(root, ref)) for ref in _TEST.findall(text)]
      found += [
        (
          ref,
          unresolved_test_file(root, ref)
          if re.fullmatch(r'tests/[\w/]+\.py', ref)
          else path_problem(root, ref),
        )
        for ref in _PATH.findall(text)
        if not _TEST.fullmatch(ref.rstrip('/.'))
      ]
      found += [(ref, dotted_problem(root, ref)) for ref in _DOTTED.findall(text)]
      found += [
        (f'{page} "{heading}"', section_problem(root, page, heading))
        for page, heading in _SECTION.findall(text)
      ]
      stale += [
        f'{name}:{line}: {ref} ({why})' for ref, why in found if why and (name, ref) not in HISTORY
      ]
  return stale


def test_every_referenced_module_file_and_test_exists():
  stale = stale_references(REPO)
  assert stale == [], 'references to what does not exist:\n' + '\n'.join(stale)


def test_the_check_finds_planted_stale_references(tmp_path):
  (tmp_path / 'analysis' / 'numbers').mkdir(parents=True)
  (tmp_path / 'tests' / 'unit').mkdir(parents=True)
  for package in ('analysis', 'analysis/numbers'):
    (tmp_path / package / '__init__.py').write_text('')
  (tmp_path / 'analysis' / 'numbers' / 'stats.py').write_text(
    '"""Reads analysis/numbers/answer.py and analysis.numbers.stats.arms."""\n\n'
    'def arms():\n  # see tests/test_stats.py and test_gone.py\n  return 1\n'
  )
  (tmp_path / 'tests' / 'unit' / 'test_stats.py').write_text('')
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'page.md').write_text('# Page\n\n## A section\n')
  (tmp_path / 'README.md').write_text(
    'Run `python -m analysis.study` (gone), `analysis.numbers.stats.read_csv` (moved),\n'
    'analysis/numbers/stats.arms and analysis/numbers/stats.gone; analysis/forest.py;\n'
    'fine: analysis.numbers.stats, analysis/numbers/, analysis/numbers/stats*.py, '
    'numerics.profile, analysis.x, tests/test_stats.py; gone: tests/helpers.py\n'
    'See docs/page.md "A section" and docs/page.md "Another section".\n'
  )
  assert stale_references(str(tmp_path)) == [
    'README.md:1: analysis.study (analysis defines no study)',
    'README.md:1: analysis.numbers.stats.read_csv (analysis.numbers.stats defines no read_csv)',
    'README.md:2: analysis/numbers/stats.gone (analysis/numbers/stats.py defines no gone)',
    'README.md:2: analysis/forest.py (no such file or folder)',
    'README.md:3: tests/helpers.py (no such file under tests/)',
    'README.md:4: docs/page.md "Another section" (docs/page.md has no heading "Another section")',
    'analysis/numbers/stats.py:1: analysis/numbers/answer.py (no such file or folder)',
    'analysis/numbers/stats.py:4: test_gone.py (no such file under tests/)',
  ]
