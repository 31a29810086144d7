"""The study's figures read alone (issue 37, item 9): each states its data set, n and platforms;
one colour per platform and a line style per arm; short arm labels; legend keys drawn as the data
are; a one-run root draws without layout warnings and nothing outside the figure; the churn
ladder says each row's n, draws every bound inside its axis and stops at 100 %."""

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from analysis import agreement, analyse, figures, stats
from tests.support.planted_predictions import planted_loader
from tests.support.planted_study import analysed, make_study
from tests.support.planted_tables import DIGITS, digits_frame

NO_STEPS = pd.DataFrame(columns=['run', 'step', 'epoch', 'train_loss', 'train_accuracy'])


@pytest.fixture(scope='module')
def digits_out():
  frame = digits_frame(('cpu', 'gpu'), seeds=range(4)).assign(
    **{'config.data.name': 'digits', 'data.test_size': 360}
  )
  frame['device_kind'] = frame['platform'].map({'cpu': 'cpu', 'gpu': 'NVIDIA H100'})
  return analyse.study_analysis(frame, DIGITS)


def drawn_figures(monkeypatch, call):
  """{name: figure} of what `call()` saves (figures.save intercepted before it closes them)."""
  drawn, save = {}, figures.save
  monkeypatch.setattr(
    figures,
    'save',
    lambda fig, d, name, crop=True: (
      drawn.setdefault(name, (fig, fig.texts, fig._suptitle, fig._supxlabel)),
      save(fig, d, name, crop),
    )[1],
  )
  call()
  return drawn


def captions(fig, suptitle, supxlabel):
  return ' '.join(t.get_text() for t in (suptitle, supxlabel) if t is not None)


def test_every_study_figure_states_data_n_and_platforms(digits_out, tmp_path, monkeypatch):
  out = digits_out
  loaded = planted_loader(out.runs, np.random.default_rng(7))
  out = dataclasses.replace(
    out, agreement=agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  )
  drawn = drawn_figures(
    monkeypatch,
    lambda: figures.study_figures(
      out, pd.DataFrame(columns=['run', 'epoch']), NO_STEPS, str(tmp_path)
    ),
  )
  assert set(drawn) == {'accuracy_by_arm', 'contrasts', 'gap_decomposition', 'churn_ladder'}
  for name, (fig, _, top, bottom) in drawn.items():
    text = captions(fig, top, bottom).replace('\n', ' ')
    assert 'digits (test 360 images)' in text and 'n = 4 seeds per arm, 64 runs' in text, name
    assert 'cpu; gpu: NVIDIA H100' in text, name


def test_training_curves_eight_arms_on_one_platform_each_its_own_colour_marker_and_line(digits_out):
  out = digits_out
  cpu = out.runs[out.runs['platform'] == 'cpu']
  steps = pd.DataFrame(
    [
      {'run': r, 'step': t, 'epoch': 1, 'train_loss': 1.0 / t, 'train_accuracy': 0.5}
      for r in cpu['run']
      for t in range(1, 6)
    ]
  )
  figures.apply()
  fig = figures.draw_training_curves(out, pd.DataFrame(columns=['run', 'epoch']), steps)
  lines = fig.axes[0].get_lines()
  assert len(lines) == 8 and len(fig.axes) == 1  # no test history: the loss panel alone
  assert len({to_hex(line.get_color()) for line in lines}) == 8
  dashes = {str(line._unscaled_dash_pattern) for line in lines}
  assert len(dashes) == 8 and len({line.get_marker() for line in lines}) == 8


def test_short_arm_labels_never_a_config():
  arm = (
    'cpu, CPU, profile=, batchnorm_group=0, compute_dtype=float32, conv_format=, '
    'conv_impl=auto, dense_format=, xla_flags='
  )
  assert figures.short_labels([arm]) == {arm: figures.ONE_ARM}
  two = [
    'cpu, profile=tpu_default, compute_dtype=float32',
    'cpu, profile=f32, compute_dtype=float32',
  ]
  assert list(figures.short_labels(two).values()) == ['tpu_default', 'f32']
  long = [
    f'cpu, optim.learning_rate=0.00{i}, model.width=0.2{i}, data.image_size=3{i}' for i in range(3)
  ]
  short = figures.short_labels(long)
  assert (
    all(len(v) <= figures.LABEL_CHARS for v in short.values()) and len(set(short.values())) == 3
  )


def test_contrast_legend_keys_are_drawn_as_the_estimates(digits_out):
  out = digits_out
  figures.apply()
  fig = figures.draw_contrasts(
    figures.contrast_table(out), figures.floors_of(out.noise), out.margin, out.unit
  )
  legend = fig.legends[0]
  keys = dict(zip((t.get_text() for t in legend.get_texts()), legend.legend_handles, strict=True))
  drawn = {
    (to_hex(line.get_color()), line.get_marker())
    for line in fig.axes[0].lines
    if line.get_marker() == 'D'
  }
  for p in ('cpu', 'gpu'):
    key = keys[p]
    assert (to_hex(key.get_color()), key.get_marker()) in drawn  # a swatch would be a Patch


def test_a_one_run_root_draws_without_layout_warnings_or_clipping(tmp_path):
  make_study(tmp_path / 'runs', arms=(('cpu', 'float32', 0.9),), seeds=range(1))
  out, hist, steps = analysed(tmp_path / 'runs')
  figures.apply()
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # constrained_layout's "axes sizes collapsed" is a UserWarning
    figs = [figures.draw_accuracy_by_arm(out), figures.draw_training_curves(out, hist, steps)]
    for fig in figs:
      fig.canvas.draw()
      inside = fig.bbox.padded(1)
      for artist in [
        *fig.legends,
        *[a.get_legend() for a in fig.axes if a.get_legend()],
        fig._suptitle,
      ]:
        box = artist.get_window_extent()
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1, artist
  labels = [t.get_text() for t in figs[1].legends[0].get_texts()]
  assert labels == [figures.ONE_ARM]


def test_the_churn_ladder_says_n_and_draws_every_bound_inside_its_axis(digits_out):
  out = digits_out
  loaded = planted_loader(out.runs, np.random.default_rng(8))
  table = agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get).table
  table = pd.concat(
    [
      table,
      table.iloc[[0]].assign(  # a row near 100 %: no axis past it
        kind='platform', churn_pct=99.5, ci_low=98.9, ci_high=99.9, per_seed_pct='99.1, 99.9'
      ),
    ]
  )
  fig = figures.draw_churn_ladder(table, figures.context_line(out))
  ax = fig.axes[0]
  low, high = ax.get_xlim()
  assert low == 0 and high == 100
  for line in ax.lines:
    assert all(low <= x <= high for x in line.get_xdata())
  labels = [t.get_text().replace('\n', ' ') for t in ax.get_yticklabels()]
  assert all(label.endswith(('seeds)', 'clusters)')) for label in labels), labels
  assert not any('profile=' in label for label in labels)
  assert 'numerics setting: cpu: f32 vs native (4 seeds)' in labels  # 'vs cpu: native' once
  assert 'seed: init and data order: every arm on cpu (2 clusters)' in labels
