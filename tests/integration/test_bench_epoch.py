"""bench_step --mode epoch runs end to end at a minimal size and prints its table (nothing is
timed against a target)."""

import pytest

from benchmarks import bench_step


def test_bench_epoch_prints_each_item_as_a_share_of_the_epoch(capsys, keep_matmul_precision):
  bench_step.main(
    [
      '--mode',
      'epoch',
      '--image-size',
      '8',
      '--stem',
      'small',
      '--width',
      '0.125',
      '--batch',
      '8',
      '--train-examples',
      '40',
      '--test-examples',
      '12',
      '--steps',
      '1',
      '--windows',
      '1',
      '--warmup',
      '0',
      '--repeats',
      '1',
      '--devices',
      '1',
      '--config.eval_batch_size=8',
    ]
  )
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('epoch_overhead_fraction=') and float(lines[-1].split('=')[1]) > 0
  text = '\n'.join(lines)
  assert 'epoch = 5 steps (40 examples)' in text and '| training step | ' in text
  assert '| evaluation (12 examples, 2 batch(es) of 8) |' in text
  assert '| checkpoint save, synchronous part (' in text and 'x the step |' in text


def test_bench_epoch_refuses_an_epoch_without_a_batch(capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_step.main(['--mode', 'epoch', '--batch', '64', '--train-examples', '10'])
  assert exit_info.value.code == 2
  assert (
    capsys.readouterr().err.strip() == 'error: --train-examples=10: need at least one batch of 64'
  )
