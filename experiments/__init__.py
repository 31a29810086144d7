"""Experiments on the numerics (docs/numerics.md); what their commands share: the report's files."""

import json
import pathlib
import sys

from runrecord import files


def write_report(dest, result, stem, markdown, figure):
  """STEM.md, STEM.json and `figure`'s files written through `dest`; 0, or 1 if the write fails."""

  def write(folder):
    md, js = pathlib.Path(folder, f'{stem}.md'), pathlib.Path(folder, f'{stem}.json')
    md.write_text(markdown(result), encoding='utf-8')
    js.write_text(json.dumps(result, indent=1, default=str), encoding='utf-8')
    return [str(md), str(js), *figure(result, folder)]

  try:
    for path in dest.write(write):
      print(f'wrote {path}')
  except files.WriteFailed as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0
