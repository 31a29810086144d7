"""analysis.figures on fake Orbax runs: every figure is
written as a readable PDF and 300-dpi PNG at its printed size (one column 3.3 in, two columns 6.9
in), shows the seeds, names arms by their short labels, has legends only for what it draws (inside
the figure), and plots training from per-step records (the gap and forest figures:
tests/unit/test_figures_gap.py)."""

import dataclasses
import types

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.patches import PathPatch
from PIL import Image

from analysis import analyse, draw, figures, inputs
from sweeps import run_study
from tests.support.figure_checks import legend_problems
from tests.support.planted_study import STEPS, analysed, make_study
from tests.support.planted_tables import DIGITS, digits_frame


def check_files(paths):
  for path in paths:
    if path.endswith('.png'):
      with Image.open(path) as img:
        img.load()
        assert img.size[0] > 600 and img.size[1] > 300
        assert round(img.info['dpi'][0]) == 300
    else:
      with open(path, 'rb') as f:
        assert f.read(5) == b'%PDF-'


def test_all_figures_written_and_readable(tmp_path, capsys):
  make_study(tmp_path / 'runs')
  draw.main([f'--runs={tmp_path}/runs', f'--out={tmp_path}/figs', '--margin=0.5'])
  written = capsys.readouterr().out.split()
  names = {'accuracy_by_arm', 'contrasts', 'training_curves'}  # no declaration: no attribution
  assert sorted(written) == sorted(
    f'{tmp_path}/figs/{n}.{e}' for n in names for e in ('pdf', 'png')
  )
  check_files(written)


def test_load_steps_reads_train_records_only(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9),), seeds=range(2))
  steps = inputs.steps_frame(inputs.find_all(str(tmp_path / 'runs')))
  assert list(steps.columns) == ['run', 'step', 'epoch', 'train_loss', 'train_accuracy']
  assert len(steps) == 2 * len(STEPS) and list(steps['step'][:5]) == list(STEPS)
  assert steps['train_loss'].iloc[1] == pytest.approx(2.0 / 4)


def test_points_for_every_seed_and_no_boxes_below_ten(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9), ('gpu', 'float32', 0.899)))
  out, _, _ = analysed(tmp_path / 'runs')
  figures.apply()
  fig = figures.draw_accuracy_by_arm(out)
  ax = fig.axes[0]
  assert not [p for p in ax.patches if isinstance(p, PathPatch)]  # n = 5: no box
  points = [c for c in ax.collections if isinstance(c, PathCollection)]
  assert sorted(len(c.get_offsets()) for c in points) == [5, 5]
  low, high = ax.get_ylim()
  assert high - low < 5 and low > 80  # the y scale shows the arms' spread, not 0–100%
  assert not legend_problems(fig)
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert labels == [
    'gpu: one seed',
    'tpu: one seed',
    'mean ± 95% CI (t-interval)',
  ]  # colour = platform
  many = pd.concat([out.units.assign(seed=out.units['seed'] + 100 * k) for k in range(2)])
  fig = figures.draw_accuracy_by_arm(
    dataclasses.replace(out, units=many)
  )  # 10 seeds per arm: boxes appear
  assert len([p for p in fig.axes[0].patches if isinstance(p, PathPatch)]) == 2
  assert not legend_problems(fig)


def test_contrast_legend_lists_only_drawn_kinds(tmp_path):
  make_study(tmp_path / 'a', arms=(('tpu', 'float32', 0.9),), seeds=range(3))
  make_study(tmp_path / 'a', arms=(('gpu', 'float32', 0.9),), seeds=range(10, 13))
  out, hist, steps = analysed(tmp_path / 'a')
  figures.apply()
  fig = figures.draw_contrasts(
    figures.contrast_table(out), {}, 0.5, 'pp'
  )  # one Welch Δ, no noise arm
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ['margin ±0.5 pp', '95% CI', '90% CI', 'Δ'] and not legend_problems(fig)
  assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ['gpu − tpu']


def pdf_size_in(path):
  """(width, height) in inches of a one-page PDF's MediaBox."""
  with open(path, 'rb') as f:
    text = f.read().decode('latin-1')
  x0, y0, x1, y1 = map(float, text.split('/MediaBox')[1].split('[')[1].split(']')[0].split())
  return (x1 - x0) / 72, (y1 - y0) / 72


def test_every_figure_is_drawn_at_its_printed_size_with_short_labels_inside_the_figure(tmp_path):
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), DIGITS)
  paths = figures.study_figures(
    out,
    pd.DataFrame(columns=['run', 'epoch']),
    pd.DataFrame(columns=list(inputs.STEP_COLUMNS)),
    str(tmp_path),
  )
  widths = {
    'accuracy_by_arm': figures.TWO_COLUMN_IN,
    'contrasts': figures.ONE_COLUMN_IN,
    'gap_decomposition': figures.ONE_COLUMN_IN,
  }
  # attribution_forest (the attribution command's) is not written: it repeats contrasts and the gap
  assert sorted({p.rsplit('/', 1)[1].split('.')[0] for p in paths}) == sorted(widths)
  for name, width in widths.items():
    assert pdf_size_in(f'{tmp_path}/{name}.pdf')[0] == pytest.approx(width, abs=0.01), name
    with Image.open(f'{tmp_path}/{name}.png') as img:
      assert img.size[0] == round(300 * width), name
  figures.apply()
  fig = figures.draw_accuracy_by_arm(out)
  ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  assert ticks[:2] == ['native', 'f32'] and 'BN/16' in ticks and 'bf16\nactivations' in ticks
  assert not any('=' in t for t in ticks) and not legend_problems(fig)
  assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
    'cpu: one seed',
    'gpu: one seed',
    'mean ± 95% CI (t-interval)',
  ]
  fig.canvas.draw()
  inside = fig.bbox.padded(1)
  for artist in [fig.axes[0].get_legend(), *fig.axes[0].get_xticklabels()]:
    box = artist.get_window_extent()
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1, artist


def band_colors(ax):
  """{edge colour of each noise band (axvspan)}."""
  return {to_hex(p.get_edgecolor()) for p in ax.patches if p.get_label().startswith('noise floor')}


def test_a_platform_has_one_colour_in_every_figure():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), DIGITS)
  cpu, gpu = (to_hex(figures.PLATFORM_COLORS[p]) for p in ('cpu', 'gpu'))
  assert figures.platform_colors(['gpu']) == {
    'gpu': figures.PLATFORM_COLORS['gpu']
  }  # whatever else a figure shows
  assert figures.platform_colors(['tpu', 'gpu', 'cpu'])['gpu'] == figures.PLATFORM_COLORS['gpu']
  figures.apply()
  ax = figures.draw_accuracy_by_arm(out).axes[0]
  info = out.arm_info
  points = [c for c in ax.collections if isinstance(c, PathCollection)]
  assert len(points) == len(info)
  assert {to_hex(c.get_edgecolor()[0]) for c in points} == {cpu, gpu}
  ax = figures.draw_contrasts(
    figures.contrast_table(out), figures.floors_of(out.noise), out.margin, out.unit
  ).axes[0]
  assert {to_hex(line.get_color()) for line in ax.lines if line.get_marker() != 'None'} >= {
    cpu,
    gpu,
  }
  assert band_colors(ax) == {cpu, gpu}
  att = out.attribution
  gap_ax = figures.draw_gap(att).axes[0]
  colours = {t.get_text(): None for t in gap_ax.get_yticklabels()}
  at = {
    line.get_ydata()[0]: to_hex(line.get_color())
    for line in gap_ax.lines
    if line.get_marker() == 'D'
  }
  assert (at[4], at[3], at[5]) == (gpu, cpu, to_hex(figures.ACROSS_PLATFORMS)), colours
  assert band_colors(gap_ax) == band_colors(figures.draw_forest(att).axes[0]) == {cpu, gpu}


def test_contrasts_draw_one_noise_band_and_legend_key_per_platform():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), DIGITS)
  figures.apply()
  fig = figures.draw_contrasts(figures.contrast_table(out), {'cpu': 0.4, 'gpu': 0.5}, 2.0, 'pp')
  legend = fig.legends[0]
  keys = {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)}
  assert [k for k in keys if k.startswith('noise')] == [
    'noise floor gpu ±0.50 pp',
    'noise floor cpu ±0.40 pp',
  ]
  for p in ('cpu', 'gpu'):
    assert to_hex(
      keys[f'noise floor {p} ±{0.4 if p == "cpu" else 0.5:.2f} pp'].get_edgecolor()
    ) == (to_hex(figures.PLATFORM_COLORS[p]))
  assert sorted(
    round(p.get_x() + p.get_width(), 6)
    for p in fig.axes[0].patches
    if p.get_label().startswith('noise')
  ) == [0.4, 0.5]
  assert not legend_problems(fig)


def curves_study():
  """An in-memory study of two platforms with arms native and f32; on cpu f32 is the same
  arithmetic as native (identical curves), on gpu it differs."""
  arms = [('cpu', 'native', 0.0), ('cpu', 'f32', 0.0), ('gpu', 'native', 0.1), ('gpu', 'f32', 0.2)]
  info = pd.DataFrame([{'arm': f'{p}, {a}', 'platform': p, 'label': a} for p, a, _ in arms])
  runs = pd.DataFrame(
    [{'run': f'{p}/{a}/{s}', 'arm': f'{p}, {a}'} for p, a, _ in arms for s in range(2)]
  )
  steps = pd.DataFrame(
    [
      {
        'run': f'{p}/{a}/{s}',
        'step': t,
        'epoch': t // 10 + 1,
        'train_loss': 1.0 / t + d + 0.01 * s,
        'train_accuracy': 0.5,
      }
      for p, a, d in arms
      for s in range(2)
      for t in range(1, 40)
    ]
  )
  hist = pd.DataFrame(
    [
      {'run': f'{p}/{a}/{s}', 'epoch': e, 'test_accuracy': 0.9 - d / e}
      for p, a, d in arms
      for s in range(2)
      for e in range(1, 5)
    ]
  )
  software = inputs.Software(
    platforms={
      p: inputs.Platform(kind, None, {}, {}) for p, kind in (('cpu', 'cpu'), ('gpu', 'H100'))
    }
  )
  return (
    types.SimpleNamespace(
      arm_info=info, runs=runs, arms=pd.DataFrame({'n': [2] * 4}), seeded=True, software=software
    ),
    hist,
    steps,
  )  # what it draws from


def test_identical_curves_stay_distinguishable_one_row_per_platform_and_colour_is_the_arm():
  out, hist, steps = curves_study()
  figures.apply()
  fig = figures.draw_training_curves(out, hist, steps)
  rows = [fig.axes[:3], fig.axes[3:6]]
  assert [row[0].get_ylabel() for row in rows] == ['cpu: training loss', 'gpu: training loss']
  cpu, gpu = ({line.get_label(): line for line in row[0].get_lines()} for row in rows)
  native, f32 = cpu['native'], cpu['f32']
  assert list(native.get_ydata()) == list(f32.get_ydata())  # drawn on top of each other ...
  assert native.get_marker() != f32.get_marker()  # ... yet told apart
  assert native.get_linestyle() != f32.get_linestyle()
  assert native.get_markevery() != f32.get_markevery()  # markers at different steps
  for row in (cpu, gpu):  # an arm's colour and marker are the same on every platform's row
    assert to_hex(row['native'].get_color()) == to_hex(figures.PALETTE[0])
    assert to_hex(row['f32'].get_color()) == to_hex(figures.PALETTE[1])
    assert row['f32'].get_marker() == f32.get_marker()
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ['native', 'f32 (= native on cpu)']
  # the third panel: each arm's test accuracy minus native's, in pp; by hand 0.9 − d/e with
  # d = 0.1 (native) and 0.2 (f32) on gpu: f32 − native = −10/e pp
  delta = {line.get_label(): line for line in rows[1][2].get_lines()}
  assert list(delta['f32'].get_ydata()) == pytest.approx([-10 / e for e in range(1, 5)])
  assert list(delta['native'].get_ydata()) == [0.0] * 4
  assert 'gpu: test accuracy − native (pp)' in rows[1][2].get_ylabel().replace('\n', ' ')


def test_training_curves_are_built_from_per_step_records(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9), ('gpu', 'float32', 0.899)))
  out, hist, steps = analysed(tmp_path / 'runs')
  figures.apply()
  fig = figures.draw_training_curves(out, hist, steps)
  loss_ax, test_ax = fig.axes[:2]  # the first row: gpu
  assert loss_ax.get_ylabel() == 'gpu: training loss'
  lines = {line.get_label(): line for line in loss_ax.get_lines()}
  gpu = lines['gpu']  # one platform per arm here: arms are labelled by the group-by label
  assert list(gpu.get_xdata()) == list(STEPS)
  expect = [np.mean([2 * 2.0 / s + 0.01 * seed for seed in range(5)]) for s in STEPS]
  assert list(gpu.get_ydata()) == pytest.approx(expect)
  assert loss_ax.get_yscale() == 'log' and fig.axes[3].get_xlabel() == 'training step'
  epochs = sorted(hist['epoch'].unique())
  assert list(test_ax.get_lines()[0].get_xdata()) == epochs  # every epoch, not the last half
  assert len(loss_ax.collections) == 1  # ± 1 sd band: 1 curve in the panel
  assert not legend_problems(fig)


def test_no_shared_seeds_and_colours_are_stable(tmp_path):
  make_study(tmp_path / 'a', arms=(('tpu', 'float32', 0.9),), seeds=range(3))
  make_study(tmp_path / 'a', arms=(('gpu', 'float32', 0.9),), seeds=range(10, 13))
  out, hist, _ = analysed(tmp_path / 'a')
  (tmp_path / 'f').mkdir()
  steps = inputs.steps_frame(out.runs['run'])  # read from the run folders
  paths = figures.study_figures(out, hist, steps, str(tmp_path / 'f'))
  assert len(paths) == 6 and any('training_curves' in p for p in paths)
  check_files(paths)
  labels = list(out.arms['arm'])
  assert figures.arm_colors(labels) == figures.arm_colors(labels[::-1])
  assert len(set(figures.arm_colors(labels).values())) == len(labels)


def test_figures_cli_one_line_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    draw.main([f'--runs={tmp_path}', f'--out={tmp_path}/f'])
  message = capsys.readouterr().err
  assert (
    e.value.code == 2 and message.startswith('error: --runs: no run') and message.count('\n') == 1
  )


def test_study_refuses_a_bucket_root_in_one_line(capsys):
  assert run_study.main(['--config=configs/digits.py:study', '--root=gs://bucket/study']) == 2
  message = capsys.readouterr().err
  assert (
    message.startswith('error: --root=gs://bucket/study: a study runs locally')
    and message.count('\n') == 1
  )
