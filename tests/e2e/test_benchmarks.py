"""The benchmarks run end to end at minimal sizes and print their last line (nothing is timed)."""

import glob
import os
import re
import subprocess
import sys

import pytest

from benchmarks import bench_conv, bench_input, bench_step, bench_stop_latency, bench_vs_torch
from benchmarks import common as bench_common
from configs import common, validation
from numerics import ops
from tests.conftest import ROOT
from tests.support.commands import run_module

TINY = ['--image-size', '16', '--batch', '8', '--steps', '2', '--width', '0.125']


def test_every_benchmark_flag_is_spelt_with_hyphens():
  """One spelling in every benchmark (argparse's and the sweeps' and analysis tools'): --image-size,
  never --image_size; a flag that names a config field keeps its hyphenated shorthand."""
  flags = {}
  for path in glob.glob(os.path.join(ROOT, 'benchmarks', '*.py')):
    with open(path, encoding='utf-8') as f:
      for flag in re.findall(r"'(--[A-Za-z][\w-]*)'", f.read()):  # add_argument's, tables'
        flags.setdefault(flag, os.path.basename(path))
  assert '--image-size' in flags and '--batch' in flags
  assert not {flag: where for flag, where in flags.items() if '_' in flag}


def test_bench_step_runs(capsys, keep_matmul_precision):
  bench_step.main(TINY + ['--windows', '2', '--warmup', '1', '--devices', '1'])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('images_per_sec=') and float(lines[-1].split('=')[1]) > 0
  text = '\n'.join(lines)
  assert '| ms/step (median; min-max) |' in text and 'conv_impl auto -> im2col' in text
  assert '1000 classes' in text and '16x16x3 uint8, global batch 8' in text


def test_bench_step_loads_the_config_and_emulates(capsys, keep_matmul_precision):
  """--config and --config.* reach the step through configs/common.py, the emulated format too."""
  bench_step.main(
    [
      '--config',
      'configs/digits.py:smoke',
      '--config.model.width=0.25',
      '--format',
      'bf16',
      '--emulate-impl',
      'fast',
      '--steps',
      '1',
      '--windows',
      '1',
      '--warmup',
      '0',
      '--devices',
      '1',
      '--num-classes',
      '10',
    ]
  )
  text = capsys.readouterr().out
  assert 'ResNet-18 width 0.25, small stem, 10 classes' in text  # smoke: 8^2, width 0.125
  assert '8x8x3 uint8, global batch 64' in text
  assert 'conv bf16 (emulate_impl fast -> fast), dense bf16 (emulate_impl fast -> fast)' in text


def test_bench_step_refuses_bad_input_in_one_line(capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_step.main(['--format', 'fp8'])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: config.numerics.conv_format must be one of')
  with pytest.raises(SystemExit):
    bench_step.main(['--config.optim.learning_rat=1'])
  assert 'did you mean optim.learning_rate' in capsys.readouterr().err


def test_bench_emulate_compares_native_reference_and_fast(capsys, keep_matmul_precision):
  bench_step.main(
    TINY
    + [
      '--mode',
      'emulate',
      '--windows',
      '1',
      '--warmup',
      '0',
      '--devices',
      '1',
      '--steps',
      '1',
      '--formats',
      'bf16',
      '--stem',
      'small',
      '--image-size',
      '8',
    ]
  )
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('fast_vs_reference=') and float(lines[-1].split('=')[1]) > 0
  (row,) = [line for line in lines if line.startswith('| bf16 |')]
  cells = [c.strip() for c in row.split('|')[1:-1]]
  assert cells[1] == 'compute_dtype=bfloat16'  # CPU: no precision level computes bf16 products
  assert all(float(c) > 0 for c in cells[2:8]) and cells[8] == ops.resolve_impl(
    'auto', 'cpu', 'bf16'
  )


def test_bench_emulate_native_variant_of_each_format():
  def native(fmt, platform):
    return bench_step.emulate_variants([fmt], platform)[fmt]['native']

  assert native('bf16', 'tpu') == (
    ('numerics.conv_format', 'native'),
    ('numerics.dense_format', 'native'),
    ('numerics.matmul_precision', 'default'),
  )
  assert native('bf16_3x', 'tpu')[2] == ('numerics.matmul_precision', 'high')
  assert native('f32', 'tpu')[2] == ('numerics.matmul_precision', 'highest')  # 6 passes, both
  assert native('tf32', 'gpu')[2] == ('numerics.matmul_precision', 'default')
  assert native('f32', 'gpu')[2] == ('numerics.matmul_precision', 'highest')
  assert native('bf16', 'gpu')[2] == ('numerics.compute_dtype', 'bfloat16')
  assert native('tf32', 'cpu') is None and native('bf16_3x', 'gpu') is None
  plan = bench_step.emulate_variants(['f32', 'tf32'], 'gpu')
  assert plan['f32']['fast'] is None and plan['tf32']['fast'] == (
    ('numerics.conv_format', 'tf32'),
    ('numerics.dense_format', 'tf32'),
    ('numerics.emulate_impl', 'fast'),
  )


def test_bench_vs_torch_runs(capsys, keep_matmul_precision):
  bench_vs_torch.main([*TINY, '--windows', '2', '--warmup', '0', '--no-compile'])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('speedup_vs_torch=') and float(lines[-1].split('=')[1]) > 0
  assert any(line.startswith('| torch eager |') for line in lines)


def analytic_gmacs(*overrides):
  config = validation.resolve(common.load(bench_common.DEFAULT_CONFIG, list(overrides)))
  return bench_step.analytic_macs(config) / 1e9


def test_analytic_flops_match_reference():
  # torchvision's model cards of ResNet18_Weights and ResNet50_Weights.IMAGENET1K_V1 list 1.81 and
  # 4.09 "GFLOPS" at 224^2, which are multiply-adds (fvcore's count); the convolutions scale with
  # the pixel count: 0.59 G at 128^2.
  assert abs(analytic_gmacs(('data.image_size', 224)) - 1.814) < 0.001
  assert abs(analytic_gmacs(('data.image_size', 128)) - 0.593) < 0.001
  assert abs(analytic_gmacs(('data.image_size', 224), ('model.name', 'resnet50')) - 4.09) < 0.001
  assert bench_step.peak_tflops('NVIDIA H100 80GB HBM3', 'bf16') == 989.0
  assert bench_step.peak_tflops('cpu', 'f32') is None


def test_bench_feed_runs_every_feed(capsys, keep_matmul_precision):
  bench_step.main(TINY + ['--mode', 'feed', '--windows', '2', '--warmup', '1', '--examples', '24'])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('real_vs_synthetic=') and float(lines[-1].split('=')[1]) > 0
  assert [
    line.split(' |')[0] for line in lines if line.startswith(('| synthetic', '| host', '| device'))
  ] == ['| synthetic', '| host', '| device']


def test_bench_step_profile_summarises_the_trace(tmp_path, subprocess_env):
  """In its own process: once a process has made TPU topology devices (tests/tpu, libtpu loaded),
  a CPU profile of it holds no XLA operations."""
  args = ['--mode', 'profile', '--warmup', '1', '--devices', '1', '--trace-dir', str(tmp_path)]
  proc = run_module(['benchmarks.bench_step', *TINY, *args], subprocess_env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  fraction = float(lines[-1].split('=')[1])
  assert lines[-1].startswith('device_busy_fraction=') and 0 < fraction <= 1
  text = '\n'.join(lines)
  assert '| convolution |' in text or '| matmul |' in text  # the step's products were seen
  assert bench_step.find_trace(str(tmp_path)).endswith('perfetto_trace.json.gz')


def test_profile_summary_arithmetic():
  events = [
    {'ph': 'X', 'pid': 1, 'ts': 0, 'dur': 10, 'name': 'cudnn_conv_fprop'},
    {'ph': 'X', 'pid': 1, 'ts': 5, 'dur': 10, 'name': 'loop_add_fusion'},
    {'ph': 'X', 'pid': 1, 'ts': 30, 'dur': 10, 'name': 'input_reduce_fusion'},
    {'ph': 'X', 'pid': 2, 'ts': 0, 'dur': 99, 'name': 'python'},
    {'ph': 'M', 'pid': 1, 'name': 'process_name', 'args': {'name': '/device:GPU:0'}},
    {'ph': 'M', 'pid': 2, 'name': 'process_name', 'args': {'name': '/host:CPU'}},
  ]
  device, source = bench_step.device_events(events)
  assert source == 'device' and len(device) == 3
  s = bench_step.trace_summary(device, steps=2)
  assert s['busy'] == 12.5 and s['span'] == 20 and s['kernel_sum'] == 15  # union of [0,15], [30,40]
  assert s['by_category'] == {'convolution': 5, 'elementwise fusion': 5, 'reduction fusion': 5}


HLO = """HloModule m
%fused_computation.1 (p: f32[4]) -> f32[] {
  %p = f32[4]{0} parameter(0)
  %c = f32[] constant(0)
  ROOT %r = f32[] reduce(%p, %c), dimensions={0}, to_apply=%add
}
%fused_computation.2 (p.1: f32[4,4]) -> f32[4,4] {
  %p.1 = f32[4,4]{1,0} parameter(0)
  ROOT %t = f32[4,4]{0,1} transpose(%p.1), dimensions={1,0}
}
ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %ynn_fusion.1 = f32[] fusion(%a), kind=kCustom, calls=%fused_computation.1
  %loop_fusion = f32[4,4]{1,0} fusion(%a), kind=kLoop, calls=%fused_computation.2
  %conv.3 = (f32[4,4]{1,0}, u8[0]{0}) custom-call(%a, %a), custom_call_target="__cudnn$convForward"
  %dot.1 = f32[4,4]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %e = f32[4,4]{1,0} exponential(%a)
}"""


def test_kernels_are_classified_by_the_hlo_they_run():
  cats = bench_step.hlo_categories(HLO)
  assert cats['ynn_fusion.1'] == 'reduction fusion'  # the name says nothing; the body reduces
  assert cats['loop_fusion'] == 'copy/transpose'
  assert cats['conv.3'] == 'convolution' and cats['dot.1'] == 'matmul'
  assert cats['e'] == 'elementwise fusion'
  kernel = {
    'ph': 'X',
    'pid': 1,
    'ts': 0,
    'dur': 4,
    'name': 'sm90_kernel_x',
    'args': {'hlo_op': 'conv.3'},
  }
  assert bench_step.event_category(kernel, cats) == 'convolution'
  assert bench_step.event_category({'name': 'sm90_xmma_gemm_bf16', 'args': {}}, {}) == 'matmul'


def test_step_benchmarks_import_no_tensorflow(subprocess_env):
  """The GPU image has no TensorFlow or tensorboardX: the step benchmarks must run without them
  (ml_collections, which the config loader needs, is carried there as a wheel: BENCHMARKS.md).
  Their heavy imports are made where they run, so a toy step is run, not only imported."""
  code = (
    'import sys; from benchmarks import bench_conv, bench_step; '
    "bench_step.main(['--image-size', '8', '--stem', 'small', '--width', '0.125', '--batch', '8', "
    "'--steps', '1', '--windows', '1', '--warmup', '0', '--num-classes', '10']); "
    "print(sorted(m for m in ('tensorflow', 'tensorboardX') if m in sys.modules))"
  )
  out = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    env=subprocess_env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == '[]'


def test_bench_analysis_times_after_every_import_of_the_tools(subprocess_env):
  """What bench_analysis times starts after the imports (its module doc): the analysis modules the
  tools use are loaded before run_tool is called (answer and report were imported inside it)."""
  code = (
    'import sys; from benchmarks import bench_analysis; '
    "bench_analysis.run_tool = lambda tool, path: ' '.join(m for m in ('analysis.analyse', "
    "'analysis.report', 'analysis.stats', 'analysis.attribution', 'analysis.agreement', "
    "'analysis.declaration', 'analysis.inputs') if m not in sys.modules) or 'none'; "
    "bench_analysis.measure('stats', 'unread.csv')"
  )
  out = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    env=subprocess_env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert '"method": "none"' in out.stdout.strip().splitlines()[-1], out.stdout


def test_bench_resume_metrics_reads_the_file_it_resumes_and_keeps_it(tmp_path, capsys):
  bench_stop_latency.main(['--resume-metrics', str(tmp_path), '--size-mb', '0.2'])
  row = capsys.readouterr().out.strip().splitlines()[-1].split('|')
  size_before = os.path.getsize(tmp_path / 'metrics.jsonl')
  assert int(row[2].replace(',', '')) > 1000 and float(row[4]) > 0
  bench_stop_latency.main(['--resume-metrics', str(tmp_path), '--size-mb', '0.2'])  # reused
  assert os.path.getsize(tmp_path / 'metrics.jsonl') == size_before  # every record kept


def test_a_flag_of_another_mode_is_refused_in_one_line(capsys):
  """One program, several modes: a mode's own flag given in another would go silently unused."""
  for main, argv, message in (
    (bench_step.main, ['--formats', 'bf16'], '--formats belongs to --mode emulate'),
    (bench_conv.main, ['--size', '8'], '--size belongs to --pool'),
    (bench_stop_latency.main, ['--size-mb', '1'], '--size-mb belongs to --resume-metrics'),
  ):
    with pytest.raises(SystemExit) as exit_info:
      main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith(f'error: {message}')


def test_resume_metrics_refuses_a_metrics_file_it_did_not_write(tmp_path, capsys):
  user = tmp_path / 'metrics.jsonl'
  user.write_text('{"kind": "train", "step": 1}\n')
  user.chmod(0o600)
  with pytest.raises(SystemExit) as exit_info:
    bench_stop_latency.main(['--resume-metrics', str(tmp_path), '--size-mb', '0.01'])
  assert exit_info.value.code == 2 and 'metrics.jsonl' in capsys.readouterr().err
  assert (
    user.read_text() == '{"kind": "train", "step": 1}\n' and user.stat().st_mode & 0o777 == 0o600
  )


def test_bench_input_leaves_the_users_files_in_its_workdir(tmp_path, capsys):
  """A folder holding the user's files where the fixture would go is refused; a file of the user's
  beside the fixture stays, byte for byte, after a run (which removes only what it generated)."""
  (tmp_path / 'files').mkdir()
  (tmp_path / 'files' / 'mine.txt').write_text('keep')
  tiny = ['--workdir', str(tmp_path), '--images', '40', '--identities', '8', '--image-size', '8']
  tiny += ['--gather-steps', '1', '--batch', '4']
  with pytest.raises(SystemExit) as exit_info:
    bench_input.main(tiny)
  assert exit_info.value.code == 2 and 'holds files but no fixture' in capsys.readouterr().err
  assert (tmp_path / 'files' / 'mine.txt').read_text() == 'keep'
  os.rename(tmp_path / 'files' / 'mine.txt', tmp_path / 'mine.txt')
  (tmp_path / 'files').rmdir()
  bench_input.main(tiny)
  assert (
    sorted(os.listdir(tmp_path)) == ['mine.txt'] and (tmp_path / 'mine.txt').read_text() == 'keep'
  )
