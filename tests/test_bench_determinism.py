"""benchmarks/bench_determinism.py runs end to end at a minimal size (on CPU both variants compile
the same program: XLA:CPU is deterministic either way)."""

from benchmarks import bench_determinism
from tests.test_benchmarks import keep_matmul_precision  # noqa: F401 (a fixture)
from trainer import steps


def test_bench_determinism_prints_both_variants_and_the_ratio(capsys, keep_matmul_precision,  # pylint: disable=redefined-outer-name,unused-argument
                                                              fast_compile, monkeypatch):
  compiles, compile_step = [], steps.Seeded.compile  # the training step's compiles
  monkeypatch.setattr(steps.Seeded, 'compile',
                      lambda self, *a, **k: compiles.append(a) or compile_step(self, *a, **k))
  bench_determinism.main(['--image-size', '8', '--stem', 'small', '--width', '0.125', '--batch',
                          '8', '--steps', '1', '--windows', '1', '--warmup', '0', '--devices', '1',
                          '--repeat-steps', '2', '--num-classes', '10'])
  assert len(compiles) == 2  # the two variants from one lowering, no unused third
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('deterministic_vs_nondeterministic=')
  assert float(lines[-1].split('=')[1]) > 0
  rows = [l for l in lines if l.startswith('| deterministic |') or
          l.startswith('| nondeterministic |')]
  assert len(rows) == 2
  for row in rows:  # the step lowers without scatter or sort, and the CPU repeats it exactly
    cells = [c.strip() for c in row.split('|')[1:-1]]
    assert cells[3] == 'none' and cells[4] == 'yes', row
