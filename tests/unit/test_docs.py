"""The documentation holds together: every relative link in README.md, BENCHMARKS.md,
results/README.md and docs/*.md resolves (the file, and the heading its #anchor names), README.md
stays within 200 lines and BENCHMARKS.md within 310."""

import glob
import os
import re

from conftest import ROOT

FENCE = re.compile(r'^(```|~~~).*?^\1[^\n]*$', re.S | re.M)
CODE = re.compile(r'`[^`\n]*`')
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
HEADING = re.compile(r'^#{1,6}\s+(.*?)\s*#*\s*$', re.M)
EXTERNAL = ('http://', 'https://', 'mailto:')


def prose(text):
  """The Markdown without fenced code blocks and inline code spans (links there are literal)."""
  return CODE.sub('', FENCE.sub('', text))


def anchor(heading):
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(path):
  """Every anchor the headings of the Markdown file at `path` define (repeats get -1, -2, ...)."""
  with open(path, encoding='utf-8') as f:
    names = [anchor(h) for h in HEADING.findall(FENCE.sub('', f.read()))]
  seen, out = {}, set()
  for name in names:
    out.add(f'{name}-{seen[name]}' if name in seen else name)
    seen[name] = seen.get(name, 0) + 1
  return out


def broken_links(path):
  """'FILE: TARGET (why)' for each relative link of the Markdown file at `path` that does not
  resolve: a missing file or folder, or an anchor no heading of the target file defines."""
  with open(path, encoding='utf-8') as f:
    targets = LINK.findall(prose(f.read()))
  broken = []
  for target in targets:
    if target.startswith(EXTERNAL):
      continue
    file_part, _, fragment = target.partition('#')
    resolved = (
      os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    )
    if not os.path.exists(resolved):
      broken.append(f'{path}: {target} (no such file)')
    elif fragment and (not resolved.endswith('.md') or fragment not in anchors(resolved)):
      broken.append(f'{path}: {target} (no heading with anchor #{fragment})')
  return broken


def documents():
  return [
    os.path.join(ROOT, name)
    for name in ('README.md', 'BENCHMARKS.md', os.path.join('results', 'README.md'))
  ] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def line_count(name):
  with open(os.path.join(ROOT, name), encoding='utf-8') as f:
    return len(f.read().splitlines())


def test_every_relative_link_resolves():
  docs = documents()
  assert len(docs) >= 9, docs  # README, BENCHMARKS, results/README and the docs/ pages
  assert [b for path in docs for b in broken_links(path)] == []


def test_the_readme_links_every_docs_page():
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    linked = set(LINK.findall(prose(f.read())))
  pages = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
  assert pages and [p for p in pages if p not in linked] == []


def test_lengths():
  assert line_count('README.md') <= 200
  assert line_count('BENCHMARKS.md') <= 310


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'page.md').write_text(
    '# A page\n\n## Two words, one comma\n\n## Repeat\n\n## Repeat\n', encoding='utf-8'
  )
  (tmp_path / 'README.md').write_text(
    '[ok](docs/page.md) [ok](docs/page.md#two-words-one-comma) [ok](docs/page.md#repeat-1)\n'
    '[ok](#top) [ok](https://example.org/x) `[code](nowhere.md)`\n\n# Top\n\n'
    '```\n[in a block](nowhere.md)\n# not a heading\n```\n'
    '[gone](docs/other.md) [bad anchor](docs/page.md#not-a-heading) [bad](#not-a-heading)\n',
    encoding='utf-8',
  )
  readme = str(tmp_path / 'README.md')
  assert broken_links(readme) == [
    f'{readme}: docs/other.md (no such file)',
    f'{readme}: docs/page.md#not-a-heading (no heading with anchor #not-a-heading)',
    f'{readme}: #not-a-heading (no heading with anchor #not-a-heading)',
  ]
