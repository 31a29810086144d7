"""A study's run folders planted without training, for the figures: Orbax results and a
metrics.jsonl per run (train and epoch records, one torn last line)."""

import json

import numpy as np

from analysis import analyse, inputs
from runrecord import record

STEPS = (2, 4, 6, 8, 10)  # logged training steps of every fake run, 2 per epoch


def fake_results(seed, acc, platform, dtype):
  req = {
    'matmul_precision': 'highest',
    'compute_dtype': dtype,
    'param_dtype': 'float32',
    'emulate': 'none',
    'batchnorm_group': 0,
    'gpu_deterministic': True,
  }
  hist = [
    {
      'epoch': e,
      'step': 10 * e,
      'test_accuracy': acc * (1 - 0.5**e),
      'test_loss': 2.0 / e,
      'train_loss': 1.0 / e,
      'lr': 0.01,
      'wall_time': float(e),
    }
    for e in range(1, 6)
  ]
  return {
    'status': 'completed',
    'reason': '',
    'seed': seed,
    'platform': platform,
    'device_kind': platform.upper(),
    'num_devices': 1,
    'num_processes': 1,
    'numerics': {'requested': req, 'effective': req},
    'final': {'test_accuracy': acc, 'test_loss': 0.4, 'train_loss': 0.2},
    'history': hist,
    'config': {'seed': seed},
    'versions': {},
    'wall_time_s': 1.0,
    'step': 50,
    'total_steps': 50,
    'data': {},
  }


def write_metrics(run, seed, scale):
  """A metrics.jsonl as trainer/metrics.py writes it: train records, epoch records, one bad line."""
  lines = []
  for step in STEPS:
    lines.append(
      {
        'kind': 'train',
        'step': step,
        'epoch': (step + 1) // 2,
        'train_loss': scale * 2.0 / step + 0.01 * seed,
        'train_accuracy': 1 - 1.0 / step,
        'learning_rate': 0.01,
        'images_per_sec': 100.0,
      }
    )
    if step % 4 == 0:
      lines.append({'kind': 'epoch', 'epoch': step // 4, 'step': step, 'train_loss': 1.0})
  text = ''.join(json.dumps(line) + '\n' for line in lines) + '{"kind": "tra'  # killed mid-write
  (run / inputs.METRICS_FILE).write_text(text)


def make_study(
  root,
  arms=(('tpu', 'float32', 0.90), ('gpu', 'float32', 0.899), ('gpu', 'bfloat16', 0.88)),
  seeds=range(5),
):
  rng = np.random.default_rng(0)
  for k, (platform, dtype, acc) in enumerate(arms):
    for seed in seeds:
      run = root / f'{platform}_{dtype}' / f's{seed}'
      record.write_results(
        str(run), fake_results(seed, acc + rng.normal(0, 0.003), platform, dtype)
      )
      write_metrics(run, seed, 1.0 + k)


def analysed(root, **kw):
  runs, hist = inputs.load(str(root))
  return analyse.study_analysis(runs, **kw), hist, inputs.steps_frame(inputs.find_all(str(root)))
