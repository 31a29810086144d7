"""The forest plots (analysis/figures.py) on a planted digits attribution: the gap figure draws the
gap as the sum of its parts with the margin and the noise floors; the forest draws the
decomposition and no unqualified platform term."""

import dataclasses

import pytest

from analysis import analyse, figures
from tests.support.figure_checks import legend_problems
from tests.support.planted_tables import DIGITS, digits_frame


def digits_attribution():
  """The attribution of the digits fraction on cpu and gpu, 4 seeds (planted noise per run)."""
  return analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), DIGITS).attribution


def markers_at(ax):
  """{row y: x of the estimate marker} of a forest axis (the 'D' markers)."""
  return {
    line.get_ydata()[0]: line.get_xdata()[0]
    for line in ax.lines
    if line.get_marker() == 'D' and len(line.get_xdata()) == 1
  }


def test_gap_figure_draws_the_gap_as_the_sum_of_its_parts_with_margin_and_noise_floors():
  att = digits_attribution()
  fig = figures.draw_gap(att)
  ax = fig.axes[0]
  d = att.decomposition[0]
  labels = [t.get_text() for t in ax.get_yticklabels()]
  assert labels == [
    f'native gap G (gpu − cpu):\n{d.verdict} at ±2 pp',
    'fidelity on gpu: fid_A',
    'fidelity on cpu, negated: −fid_B',
    'numerics part N',
    'platform part P',
    'residual R = G − N',
  ]
  assert not any(label.startswith(('=', '−', '+')) for label in labels)
  assert 'G = fid_A − fid_B + N + P' in ax.get_xlabel()
  at = markers_at(ax)  # y 5 (top) .. 0: G, fid_A, −fid_B, N, P, R
  assert at[4] == pytest.approx(d.fid_A.estimate) and at[3] == pytest.approx(-d.fid_B.estimate)
  assert d.fid_B.estimate != pytest.approx(0)  # the sign is seen
  assert at[5] == pytest.approx(at[4] + at[3] + at[2] + at[1])  # G = fid_A − fid_B + N + P
  assert at[0] == pytest.approx(d.R.estimate)
  dashed = sorted(line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == '--')
  assert dashed == [-2, 2]
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  for p in ('cpu', 'gpu'):
    assert f'noise floor {p} ±{att.noise[p].half:.2f} pp' in labels
  assert not legend_problems(fig)
  partly = dataclasses.replace(d, verdict='partly explained', open='the residual is not within ±2')
  assert figures.verdict_line(partly, 'pp') == 'partly explained at ±2 pp'


def test_forest_draws_the_decomposition_and_no_unqualified_platform_term():
  att = digits_attribution()
  assert 'platform=gpu' in set(att.terms['term'])  # the model has the pooled term
  fig = figures.draw_forest(att)
  gap_ax, effects_ax = fig.axes
  rows = [t.get_text() for t in gap_ax.get_yticklabels()]
  assert rows == [label.format(a='gpu', b='cpu') for _, label in figures.COMPONENT_ROWS]
  table = att.gap.set_index('key')
  at = markers_at(gap_ax)
  for y, (key, _) in zip(range(len(rows) - 1, -1, -1), figures.COMPONENT_ROWS, strict=True):
    assert at[y] == pytest.approx(table.loc[key, 'estimate']), key
  effects = [t.get_text() for t in effects_ax.get_yticklabels()]
  assert effects and not any('platform' in label or 'gpu' == label for label in effects)
  assert 'main effects' in effects_ax.get_title(loc='left')
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert [x for x in labels if x.startswith('noise floor')] == [
    f'noise floor {p} ±{att.noise[p].half:.2f} pp' for p in ('gpu', 'cpu')
  ]
  undecomposed = figures.draw_forest(dataclasses.replace(att, decomposition=[], gap=None))
  effects = [t.get_text() for t in undecomposed.axes[0].get_yticklabels()]
  assert 'platform gpu, mean over all arms' in effects and 'platform gpu' not in effects
