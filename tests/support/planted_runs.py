"""Run records and run folders planted without training: Orbax results as the trainer writes
them (record.write_results), a record from record.new_record, a smoke config, a sweep's runs."""

from configs import digits
from runrecord import record


def fake_results(seed, acc, platform='gpu', dtype='float32', status='completed', det=True, step=10):
  req = {
    'matmul_precision': 'highest',
    'compute_dtype': dtype,
    'param_dtype': 'float32',
    'emulate': 'none',
    'batchnorm_group': 0,
    'gpu_deterministic': det,
  }
  hist = [
    {
      'epoch': e,
      'step': 5 * e,
      'test_accuracy': acc * e / 2,
      'test_loss': 1.0 / e,
      'train_loss': 0.5 / e,
      'lr': 0.01,
      'wall_time': float(e),
    }
    for e in (1, 2)
  ]
  return {
    'status': status,
    'reason': 'loss is NaN' if status == 'failed' else '',
    'seed': seed,
    'platform': platform,
    'device_kind': 'NVIDIA H100',
    'num_devices': 1,
    'num_processes': 1,
    'numerics': {'requested': req, 'effective': req},
    'final': {'test_accuracy': acc, 'test_loss': 1.0, 'train_loss': 0.1},
    'history': hist,
    'config': {
      'seed': seed,
      'num_epochs': 2,
      'numerics': req,
      'model': {'name': 'resnet18', 'width': 0.25, 'reinit': ['stem']},
      'data': {'name': 'digits', 'image_size': 8},
    },
    'versions': {'jax': 'x'},
    'wall_time_s': 1.0,
    'step': step,
    'total_steps': 10,
    'data': {'name': 'digits', 'train_size': 1437, 'test_size': 360},
  }


def plant(root, seeds=(0, 1, 2), dtypes=('float32', 'bfloat16')):
  """Run folders root/<dtype>/s<seed> with Orbax results (no training)."""
  for dtype in dtypes:
    for seed in seeds:
      record.write_results(
        f'{root}/{dtype}/s{seed}',
        fake_results(seed, 0.80 + 0.001 * seed + (dtype == 'bfloat16') * 0.01, dtype=dtype),
      )
  return str(root)


def make_record(config, accuracy, facts=None, **numerics_effective):
  """A completed run's record as the trainer writes it (record.new_record), with a final metric;
  `facts`: where it ran (default: one process on 8 CPU devices)."""
  facts = facts or {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 8, 'num_processes': 1}
  numerics = {
    'requested': config.numerics.to_dict(),
    'effective': {**config.numerics.to_dict(), **numerics_effective},
  }
  out = record.new_record(
    config, facts, numerics, {'name': 'digits', 'fingerprint': 'abc'}, {}, {'jax': 'x'}
  )
  out.update(
    status='completed',
    step=10,
    total_steps=10,
    final={'test_accuracy': accuracy, 'test_loss': 1.0, 'train_loss': 1.0, 'train_accuracy': 0.5},
  )
  return out


def smoke(seed, **numerics):
  config = digits.get_config('smoke')
  config.seed = seed
  for key, value in numerics.items():
    config.numerics[key] = value
  return config


def fake_runs(tmp_path, n):
  from sweeps import sweep  # only here: the analysis tests planting runs need no sweep

  return [
    sweep.Run(
      {'a': i % 2}, f'a-{i % 2}', i // 2, {}, str(tmp_path / f'a-{i % 2}' / f'seed{i // 2}')
    )
    for i in range(n)
  ]


SMALL = {
  'factors': ['platform', 'profile'],
  'reference': {'profile': 'native'},
  'noise_arm': {'profile': 'bf16_noise'},
  'native': {'profile': 'native'},
  'platform_profile': {'gpu': 'jax_gpu_default', 'cpu': 'f32'},
  'margin': 1.0,
  'margin_reason': 'planted',
  'labels': {'profile': '{}'},
}


def fake_run(root, platform, profile, seed, acc):
  record.write_results(
    str(root / f'{profile}' / f'seed{seed}'),
    {
      'status': 'completed',
      'seed': seed,
      'platform': platform,
      'device_kind': platform,
      'numerics': {'requested': {'profile': profile}},
      'final': {'test_accuracy': acc},
      'versions': {'jax': {'cpu': '0.10.2', 'gpu': '0.11.2'}[platform]},
      'config': {'seed': seed},
    },
  )
