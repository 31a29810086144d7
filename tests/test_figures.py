"""analysis.figures on fake Orbax runs: every figure is written as a readable PDF and 300-dpi PNG,
shows the seeds, has legends only for what it draws, and plots training from per-step records."""

import json

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection
from matplotlib.patches import PathPatch
from PIL import Image
import pytest

from analysis import figures, results, stats, style
from trainer import record

STEPS = (2, 4, 6, 8, 10)  # logged training steps of every fake run, 2 per epoch


def fake_results(seed, acc, platform, dtype):
  req = {'matmul_precision': 'highest', 'compute_dtype': dtype, 'param_dtype': 'float32',
         'emulate': 'none', 'batchnorm_group': 0, 'gpu_deterministic': True}
  hist = [{'epoch': e, 'step': 10 * e, 'test_accuracy': acc * (1 - 0.5 ** e), 'test_loss': 2.0 / e,
           'train_loss': 1.0 / e, 'lr': 0.01, 'wall_time': float(e)} for e in range(1, 6)]
  return {'status': 'completed', 'reason': '', 'seed': seed, 'platform': platform,
          'device_kind': platform.upper(), 'num_devices': 1, 'num_processes': 1,
          'numerics': {'requested': req, 'effective': req},
          'final': {'test_accuracy': acc, 'test_loss': 0.4, 'train_loss': 0.2}, 'history': hist,
          'config': {'seed': seed}, 'versions': {}, 'wall_time_s': 1.0, 'step': 50,
          'total_steps': 50, 'data': {}}


def write_metrics(run, seed, scale):
  """A metrics.jsonl as trainer/reporting.py writes it: train records, epoch records, one bad line."""
  lines = []
  for step in STEPS:
    lines.append({'kind': 'train', 'step': step, 'epoch': (step + 1) // 2,
                  'train_loss': scale * 2.0 / step + 0.01 * seed, 'train_accuracy': 1 - 1.0 / step,
                  'learning_rate': 0.01, 'images_per_sec': 100.0})
    if step % 4 == 0:
      lines.append({'kind': 'epoch', 'epoch': step // 4, 'step': step, 'train_loss': 1.0})
  text = ''.join(json.dumps(line) + '\n' for line in lines) + '{"kind": "tra'  # killed mid-write
  (run / results.METRICS_FILE).write_text(text)


def make_study(root, arms=(('tpu', 'float32', 0.90), ('gpu', 'float32', 0.899),
                           ('gpu', 'bfloat16', 0.88)), seeds=range(5)):
  rng = np.random.default_rng(0)
  for k, (platform, dtype, acc) in enumerate(arms):
    for seed in seeds:
      run = root / f'{platform}_{dtype}' / f's{seed}'
      record.write_results(str(run), fake_results(seed, acc + rng.normal(0, 0.003), platform, dtype))
      write_metrics(run, seed, 1.0 + k)


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


def drawn(artist):
  """Whether an artist with a legend label has something on the canvas."""
  if hasattr(artist, 'get_offsets'):
    return len(artist.get_offsets()) > 0
  if hasattr(artist, 'get_xdata'):
    return len(artist.get_xdata()) > 0
  if hasattr(artist, 'lines'):  # an errorbar container
    return len(artist.lines[0].get_xdata()) > 0
  return artist.get_visible()


def legend_problems(fig):
  """Legend labels with no drawn artist of that label in the figure's axes."""
  artists = {}
  for ax in fig.axes:
    for a in [*ax.lines, *ax.collections, *ax.patches, *ax.containers]:
      if drawn(a):
        artists.setdefault(a.get_label(), a)
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
  labels = [t.get_text() for leg in legends for t in leg.get_texts()]
  assert labels, 'no legend at all'
  return [label for label in labels if label not in artists]


def analysed(root, **kw):
  runs, hist = results.load(str(root))
  return stats.analyse(runs, **kw), hist, results.load_steps(str(root))


def test_all_figures_written_and_readable(tmp_path, capsys):
  make_study(tmp_path / 'runs')
  figures.main([f'--runs={tmp_path}/runs', f'--out={tmp_path}/figs', '--margin=0.5'])
  written = capsys.readouterr().out.split()
  names = {'accuracy_by_arm', 'paired_diffs', 'training_curves'}
  assert sorted(written) == sorted(f'{tmp_path}/figs/{n}.{e}' for n in names for e in ('pdf', 'png'))
  check_files(written)


def test_load_steps_reads_train_records_only(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9),), seeds=range(2))
  steps = results.load_steps(str(tmp_path / 'runs'))
  assert list(steps.columns) == ['run', 'step', 'epoch', 'train_loss', 'train_accuracy']
  assert len(steps) == 2 * len(STEPS) and list(steps['step'][:5]) == list(STEPS)
  assert steps['train_loss'].iloc[1] == pytest.approx(2.0 / 4)


def test_points_for_every_seed_and_no_boxes_below_ten(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9), ('gpu', 'float32', 0.899)))
  out, _, _ = analysed(tmp_path / 'runs')
  style.apply()
  fig = figures.draw_accuracy_by_arm(out)
  ax = fig.axes[0]
  assert not [p for p in ax.patches if isinstance(p, PathPatch)]  # n = 5: no box
  points = [c for c in ax.collections if isinstance(c, PathCollection)]
  assert sorted(len(c.get_offsets()) for c in points) == [5, 5]
  low, high = ax.get_ylim()
  assert high - low < 5 and low > 80  # the y scale shows the arms' spread, not 0–100%
  assert not legend_problems(fig)
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert labels == ['one seed', 'mean ± 95% CI (t-interval)']
  many = pd.concat([out['units'].assign(seed=out['units']['seed'] + 100 * k) for k in range(2)])
  fig = figures.draw_accuracy_by_arm({**out, 'units': many})  # 10 seeds per arm: boxes appear
  assert len([p for p in fig.axes[0].patches if isinstance(p, PathPatch)]) == 2
  assert not legend_problems(fig)


def test_difference_legend_lists_only_drawn_kinds(tmp_path):
  make_study(tmp_path / 'a', arms=(('tpu', 'float32', 0.9),), seeds=range(3))
  make_study(tmp_path / 'a', arms=(('gpu', 'float32', 0.9),), seeds=range(10, 13))
  out, hist, steps = analysed(tmp_path / 'a')
  style.apply()
  fig = figures.draw_paired_diffs(out)  # no shared seeds: only a Welch difference
  labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert labels == ['equivalence margin ±0.5 pp', 'Δ ± 90% CI (Welch, unpaired)']
  assert not legend_problems(fig)
  make_study(tmp_path / 'b')
  out, _, _ = analysed(tmp_path / 'b')
  fig = figures.draw_paired_diffs(out)
  labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert 'Δ ± 90% CI (Welch, unpaired)' not in labels and 'one seed: A − B' in labels
  assert not legend_problems(fig)


def test_training_curves_are_built_from_per_step_records(tmp_path):
  make_study(tmp_path / 'runs', arms=(('tpu', 'float32', 0.9), ('gpu', 'float32', 0.899)))
  out, hist, steps = analysed(tmp_path / 'runs')
  style.apply()
  fig = figures.draw_training_curves(out, hist, steps)
  loss_ax, test_ax = fig.axes[:2]
  lines = {line.get_label(): line for line in loss_ax.get_lines()}
  gpu = lines['gpu (n = 5)']  # arm colours in sorted order: gpu is the second arm (k = 1)
  assert list(gpu.get_xdata()) == list(STEPS)
  expect = [np.mean([2 * 2.0 / s + 0.01 * seed for seed in range(5)]) for s in STEPS]
  assert list(gpu.get_ydata()) == pytest.approx(expect)
  assert loss_ax.get_yscale() == 'log' and 'step' in loss_ax.get_xlabel()
  low, high = test_ax.get_ylim()
  assert low > 60 and high - low < 40  # zoomed to the last epochs, not 0–100%
  assert not legend_problems(fig)


def test_no_shared_seeds_and_colours_are_stable(tmp_path):
  make_study(tmp_path / 'a', arms=(('tpu', 'float32', 0.9),), seeds=range(3))
  make_study(tmp_path / 'a', arms=(('gpu', 'float32', 0.9),), seeds=range(10, 13))
  out, hist, _ = analysed(tmp_path / 'a')
  paths = figures.make_all(out, hist, str(tmp_path / 'f'))  # steps read from the run folders
  assert len(paths) == 6 and any('training_curves' in p for p in paths)
  check_files(paths)
  labels = list(out['arms']['arm'])
  assert style.arm_colors(labels) == style.arm_colors(labels[::-1])
  assert len(set(style.arm_colors(labels).values())) == len(labels)


def test_figures_cli_one_line_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    figures.main([f'--runs={tmp_path}', f'--out={tmp_path}/f'])
  message = capsys.readouterr().err
  assert e.value.code == 2 and message.startswith('error: --runs: no run') and message.count('\n') == 1


def test_study_refuses_a_bucket_root_in_one_line(capsys):
  from sweeps import study  # pylint: disable=import-outside-toplevel
  assert study.main(['--config=configs/digits.py:study', '--root=gs://bucket/study']) == 2
  message = capsys.readouterr().err
  assert message.startswith('error: --root=gs://bucket/study: a study runs locally') and message.count('\n') == 1
