"""bench_step --mode determinism runs end to end at a minimal size (on CPU both variants compile
the same program: XLA:CPU is deterministic either way)."""

import pytest

from benchmarks import bench_step
from trainer import run

# The smallest step --mode determinism measures: 8x8 images, the small stem, width 0.125, one
# step in one window on one device.
TOY_STEP = (
  '--mode determinism --image-size 8 --stem small --width 0.125 --batch 8 --steps 1 --windows 1 '
  '--warmup 0 --devices 1 --num-classes 10'
).split()


@pytest.mark.usefixtures('keep_matmul_precision')
def test_bench_determinism_prints_both_variants_and_the_ratio(capsys, monkeypatch):
  compiles, compile_step = [], run.Seeded.compile  # the training step's compiles
  monkeypatch.setattr(
    run.Seeded, 'compile', lambda self, *a, **k: compiles.append(a) or compile_step(self, *a, **k)
  )
  bench_step.main([*TOY_STEP, '--repeat-steps', '2'])
  assert len(compiles) == 2  # the two variants from one lowering, no unused third
  # deterministic first: after nondeterministic it would reuse XLA's in-process autotuned kernels
  assert [options[0][bench_step.OPTION] for options in compiles] == [True, False]
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('deterministic_vs_nondeterministic=')
  assert float(lines[-1].split('=')[1]) > 0
  rows = [
    line
    for line in lines
    if line.startswith('| deterministic |') or line.startswith('| nondeterministic |')
  ]
  assert len(rows) == 2
  for row in rows:  # the step lowers without scatter or sort, and the CPU repeats it exactly
    cells = [c.strip() for c in row.split('|')[1:-1]]
    assert cells[3] == 'none' and cells[4] == 'yes', row


@pytest.mark.usefixtures('keep_matmul_precision')
def test_the_xla_variants_compile_and_the_autotuned_one_says_why_it_is_absent_on_cpu(capsys):
  """exclude_nondeterministic compiles and runs (the step has no select-and-scatter, which that
  flag refuses); XLA:CPU has no autotuner, so the autotuned variant is left out with its reason."""
  bench_step.main(
    [
      *TOY_STEP,
      '--repeat-steps',
      '1',
      '--variants',
      'deterministic_autotuned,exclude_nondeterministic,nondeterministic',
    ]
  )
  lines = capsys.readouterr().out.strip().splitlines()
  rows = [line.split(' |')[0][2:] for line in lines if line.startswith('| ')]
  assert [r for r in rows if r in bench_step.ALL_VARIANTS] == [
    'nondeterministic',
    'exclude_nondeterministic',
  ]
  assert any(line.startswith('deterministic_autotuned left out: ') for line in lines)
  assert lines[-1].startswith('exclude_nondeterministic_vs_nondeterministic=')


@pytest.mark.parametrize(
  'variants,message',
  [
    ('deterministic,fast', '--variants=deterministic,fast: give distinct names among '),
    ('deterministic,deterministic', '--variants=deterministic,deterministic: give distinct'),
    ('deterministic_autotuned', '--variants: deterministic_autotuned loads the autotuning'),
  ],
)
def test_a_bad_variant_list_is_one_line(variants, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_step.main(['--mode', 'determinism', '--variants', variants])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ' + message), err
