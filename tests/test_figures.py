"""analysis.figures on fake Orbax runs: every figure is written as a readable PDF and 300-dpi PNG."""

import numpy as np
from PIL import Image
import pytest

from analysis import figures, results, stats, style
from trainer import record


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


def make_study(root, arms=(('tpu', 'float32', 0.90), ('gpu', 'float32', 0.899),
                           ('gpu', 'bfloat16', 0.88)), seeds=range(5)):
  rng = np.random.default_rng(0)
  for platform, dtype, acc in arms:
    for seed in seeds:
      record.write_results(f'{root}/{platform}_{dtype}/s{seed}',
                           fake_results(seed, acc + rng.normal(0, 0.003), platform, dtype))


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
  figures.main([f'--runs={tmp_path}/runs', f'--out={tmp_path}/figs', '--margin=0.5'])
  written = capsys.readouterr().out.split()
  names = {'accuracy_by_arm', 'paired_diffs', 'training_curves'}
  assert sorted(written) == sorted(f'{tmp_path}/figs/{n}.{e}' for n in names for e in ('pdf', 'png'))
  check_files(written)


def test_no_shared_seeds_skips_paired_figure_and_colours_are_stable(tmp_path):
  make_study(tmp_path / 'a', arms=(('tpu', 'float32', 0.9),), seeds=range(3))
  make_study(tmp_path / 'a', arms=(('gpu', 'float32', 0.9),), seeds=range(10, 13))
  runs, hist = results.load(str(tmp_path / 'a'))
  out = stats.analyse(runs)
  paths = figures.make_all(out, hist, str(tmp_path / 'f'))
  assert not any('paired_diffs' in p for p in paths) and len(paths) == 4
  check_files(paths)
  labels = list(out['arms']['arm'])
  assert style.arm_colors(labels) == style.arm_colors(labels[::-1])
  assert len(set(style.arm_colors(labels).values())) == len(labels)


def test_figures_cli_one_line_error(tmp_path):
  with pytest.raises(SystemExit) as e:
    figures.main([f'--runs={tmp_path}', f'--out={tmp_path}/f'])
  assert str(e.value).startswith('error: --runs: no run') and '\n' not in str(e.value)
