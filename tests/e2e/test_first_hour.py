"""The numerics probe's console and figure, and metrics.jsonl read one line at a time at resume
(issue 29's first hour and memory)."""

import json

import numpy as np
from etils import epath

from analysis import figures
from experiments import numerics_probe
from runrecord import record
from trainer import metrics


def test_probe_says_no_difference_instead_of_naming_a_worst_layer(monkeypatch):
  """Before: a pair whose layers agree exactly named the last layer as its 'worst layer'."""
  monkeypatch.setattr(numerics_probe, 'PAIRS', (('a', 'b'), ('a', 'c')))
  same, other = np.ones((2, 2)), np.full((2, 2), 1.5)
  outs = {'a': [same, same, same], 'b': [same, same, same], 'c': [same, same, other]}
  rows = numerics_probe.pair_diffs(outs, {}, ['a', 'b', 'c'], ['K=64', 'conv1', 'fc'])
  assert rows[0]['layers'] == 0 and rows[0]['worst layer'] == numerics_probe.NO_DIFFERENCE
  assert rows[1]['worst layer'] == 'fc' and rows[1]['layers'] == 0.5 / 1.5  # ||a - c|| / ||c||


def test_probe_legend_covers_no_line(monkeypatch, tmp_path):
  """Before: the legend sat inside the matmul axes, over a line."""

  saved = []
  monkeypatch.setattr(figures, 'save', lambda fig, out, name: saved.append(fig) or [])
  settings = ['default', 'emu:bf16', 'fast:bf16', 'emu:tf32', 'high']
  result = {
    'settings': settings,
    'info': {'platform': 'cpu', 'device_kind': 'cpu'},
    'matmul': {
      s: {k: 1e-3 * (i + 1) for k in numerics_probe.MATMUL_K} for i, s in enumerate(settings)
    },
    'layers': [{'name': 'fc', 'K': 512, **{s: 1e-3 for s in settings}}],
  }
  numerics_probe.figure(result, str(tmp_path))
  fig = saved[0]
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  legend = fig.legends[0].get_window_extent(renderer)
  for ax in fig.axes:
    assert not legend.overlaps(ax.get_window_extent(renderer))
  assert [t.get_text() for t in fig.legends[0].get_texts()] == settings


def test_probe_reports_progress_while_it_compiles(capsys):
  """Before: nothing on the console for ~150 s."""
  out = numerics_probe.run_setting(
    'default', lambda x, fmt, impl: x * 2, np.ones(2), what='products'
  )
  assert list(out) == [2, 2]
  assert capsys.readouterr().err.strip().endswith('products: default')


def lines_of(path):
  return path.read_bytes().decode().splitlines()


def test_resume_streams_metrics_and_keeps_the_same_records(tmp_path, caplog, monkeypatch):
  """A resumed run keeps the whole records up to its step (torn and later lines dropped, a last
  line without newline ended), reading the file one line at a time: the whole file is never read
  at once. Deleted later, the file is rewritten whole from the kept handle."""
  path = tmp_path / record.METRICS
  records = [{'kind': 'train', 'step': s, 'train_loss': 1.0 / s} for s in (5, 10, 15, 20)]
  text = '\n'.join(json.dumps(r) for r in records[:2]) + '\n{"kind": "tr\n\n'
  text += '\n'.join(json.dumps(r) for r in records[2:])  # no final newline
  path.write_text(text)
  for whole in ('read_text', 'read_bytes'):  # the old path read it whole
    monkeypatch.setattr(epath.Path, whole, lambda *a, **k: 1 / 0)
  reporter = metrics.JsonLinesWriter(tmp_path, resume_step=15)
  monkeypatch.undo()
  assert lines_of(path) == [json.dumps(r) for r in records[:3]]
  assert caplog.text.count('line 3 is not a whole JSON record') == 1
  reporter.write_scalars(16, {'kind': 'train', 'step': 16})
  path.unlink()
  reporter.write_scalars(17, {'kind': 'train', 'step': 17})
  assert [json.loads(line)['step'] for line in lines_of(path)] == [5, 10, 15, 16, 17]
  assert caplog.text.count('line 3 is not a whole JSON record') == 1
  reporter.close()
