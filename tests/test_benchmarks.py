"""The benchmarks run end to end at minimal sizes and print their last line (nothing is timed)."""

import jax
import pytest

from benchmarks import bench_step, bench_vs_torch

TINY = ['--image-size', '16', '--batch', '8', '--steps', '2', '--width', '0.125']


@pytest.fixture
def keep_matmul_precision():
  """The benchmarks set jax_default_matmul_precision (as train.py does); restore it after."""
  before = jax.config.jax_default_matmul_precision
  yield
  jax.config.update('jax_default_matmul_precision', before)


def test_bench_step_runs(capsys, keep_matmul_precision):
  bench_step.main(TINY + ['--windows', '2', '--warmup', '1', '--devices', '1'])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('images_per_sec=') and float(lines[-1].split('=')[1]) > 0
  text = '\n'.join(lines)
  assert '| ms/step (median; min-max) |' in text and 'conv_impl auto -> im2col' in text


def test_bench_vs_torch_runs(capsys, keep_matmul_precision):
  bench_vs_torch.main(TINY + ['--rounds', '2', '--warmup', '1', '--no-compile'])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('speedup_vs_torch=') and float(lines[-1].split('=')[1]) > 0
  assert any(line.startswith('| torch eager |') for line in lines)


def test_analytic_flops_match_reference():
  # REFERENCE.md section 5: 1.814 G multiply-adds at 224^2, 0.59 G at 128^2.
  assert abs(bench_step.analytic_macs(224) / 1e9 - 1.814) < 0.001
  assert abs(bench_step.analytic_macs(128) / 1e9 - 0.593) < 0.001
  assert bench_step.peak_tflops('NVIDIA H100 80GB HBM3', 'bf16') == 989.0
  assert bench_step.peak_tflops('cpu', 'f32') is None
