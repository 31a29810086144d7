"""The TPU preflight (sweeps/preflight.py): the trainer's programs compiled for TPU topologies on
this CPU with libtpu (requirements-tpu.txt), their memory, cost and numerics.

Each preflight is one subprocess, shared by the assertions on it, once per session even under
pytest-xdist (TPU compiles take seconds each at these sizes, minutes at CelebA's): the smoke config
with the `tpu_default` profile on a single-host v5e (v5e:2x2), a multi-host v5e (v5e:2x4: 2 hosts
of 4 chips) and a v4 (v4:2x2x1: 4 megacore chips), the study config with `f32` on the first; the bad
inputs; a program over a v5e chip's 16 GiB; a short --max-batch search. Skipped only where libtpu is
not installed.
"""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import commands

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec('libtpu') is None,
  reason='libtpu is not installed (pip install -r requirements-tpu.txt; CI installs it)',
)
TOPOLOGIES = ('v5e:2x2', 'v5e:2x4', 'v4:2x2x1')
REQUIRED = (
  'topology',
  'chips',
  'hosts',
  'phase',
  'compiled',
  'memory_per_chip_gib',
  'hbm_per_chip_gib',
  'fits',
  'gflop_per_step',
  'products',
  'products_as_configured',
  'rounding_ops',
)


def preflight(tmp, *args, env=None):
  """(exit code, stdout, stderr, CSV rows or None) of `python -m sweeps.preflight ARGS --out
  tmp`."""
  out = os.path.join(tmp, 'out')
  proc = subprocess.run(
    [sys.executable, '-m', 'sweeps.preflight', *args, '--out', out],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
    env=env or {**os.environ, 'PYTHONPATH': ROOT},
  )
  path = os.path.join(out, 'preflight.csv')
  rows = list(csv.DictReader(open(path))) if os.path.exists(path) else None
  return proc.returncode, proc.stdout, proc.stderr, rows


def preflight_once(tmp_path_factory, name, *args):
  """`preflight(*args)` run once per test session, also under pytest-xdist."""

  def run(folder):
    (folder / 'result.json').write_text(json.dumps(preflight(str(folder), *args)))

  folder = commands.once_per_session(tmp_path_factory, f'tpu_preflight_{name}', run)
  return json.loads((folder / 'result.json').read_text())


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  """The smoke config, emulated bf16 products (tpu_default), on the three topologies."""
  return preflight_once(
    tmp_path_factory,
    'smoke',
    '--config=configs/digits.py:smoke',
    '--config.numerics.profile=tpu_default',
    '--topology',
    *TOPOLOGIES,
  )


@pytest.fixture(scope='module')
def study(tmp_path_factory):
  """The study config, f32 products (profile f32), on the single-host v5e (the topologies are
  the smoke fixture's question; this one's is the precision of every product)."""
  return preflight_once(
    tmp_path_factory,
    'study',
    '--config=configs/digits.py:study',
    '--config.numerics.profile=f32',
    '--topology',
    TOPOLOGIES[0],
  )


@pytest.mark.parametrize(
  'which, programs, topologies',
  [('smoke', ('frozen', 'full', 'eval'), TOPOLOGIES), ('study', ('full', 'eval'), TOPOLOGIES[:1])],
)  # study: no freeze
def test_every_phase_compiles_on_single_and_multi_host_v5e_and_v4(
  which, programs, topologies, request
):
  code, stdout, stderr, rows = request.getfixturevalue(which)
  assert code == 0, stderr[-2000:]
  assert set(REQUIRED) <= set(rows[0])
  assert [(r['topology'], r['phase']) for r in rows] == [
    (t, p) for t in topologies for p in programs
  ]
  assert all(r['compiled'] == 'True' and r['fits'] == 'True' for r in rows)
  shape = {r['topology']: (r['chips'], r['hosts'], r['devices']) for r in rows}
  # v4 runs its two TensorCores per chip as one device (megacore): 4 chips, 4 devices.
  assert shape == {
    t: s
    for t, s in {
      'v5e:2x2': ('4', '1', '4'),
      'v5e:2x4': ('8', '2', '8'),
      'v4:2x2x1': ('4', '1', '4'),
    }.items()
    if t in topologies
  }
  for r in rows:
    assert 0 < float(r['memory_per_chip_gib']) < float(r['hbm_per_chip_gib'])
    assert float(r['gflop_per_step']) > 0 and float(r['images_per_s']) > 0
    assert float(r['run_hours']) > 0 and int(r['sweep_runs']) == 48  # digits' 8 arms x 6 seeds
  assert (
    '| topology |' in stdout and 'took' in stdout and f'compiling {topologies[-1]} eval' in stdout
  )


def test_a_step_of_the_same_global_batch_has_the_same_flops_on_4_and_8_chips(smoke):
  """XLA's cost analysis is one chip's program: x chips, the step's FLOPs, whatever the split."""
  rows = {(r['topology'], r['phase']): float(r['gflop_per_step']) for r in smoke[3]}
  assert rows['v5e:2x4', 'full'] == pytest.approx(rows['v5e:2x2', 'full'], rel=0.15)


def test_f32_asks_for_the_highest_precision_in_every_product_backward_included(study):
  for r in study[3]:
    assert int(r['products']) > 0
    assert r['products_as_configured'] == r['products'], r['product_breakdown']
    assert r['configured'] == 'conv @ highest; dense @ highest'
    assert r['rounding_ops'] == '0'
    if r['phase'] == 'full':
      assert 'conv backward f32 x f32 @ highest' in r['product_breakdown']
      assert 'dense backward f32 x f32 @ highest' in r['product_breakdown']
    assert 'default' not in r['product_breakdown']


def test_tpu_default_asks_for_no_precision_and_its_rounding_survives(smoke):
  """The emulated one-pass bf16 product: bf16 operands at the default precision (no attribute)
  in every product, forward and backward, and its roundings in the TPU program."""
  for r in smoke[3]:
    assert r['configured'] == 'conv @ default; dense @ default'
    assert r['products_as_configured'] == r['products'], r['product_breakdown']
    assert 'highest' not in r['product_breakdown'] and 'f32 x f32' not in r['product_breakdown']
    assert int(r['rounding_ops']) > 0
  # frozen: 20 forward convs + the dense head, the input gradients back to the stem, the stem's
  # and the head's weight gradients
  frozen = next(r for r in smoke[3] if r['phase'] == 'frozen')
  assert int(frozen['products']) == 43


def run_quick(tmp_path, *args):
  code, stdout, stderr, rows = preflight(str(tmp_path), *args)
  return code, stdout, stderr.strip().splitlines(), rows


def test_a_bad_topology_is_one_line_and_exit_2(tmp_path):
  code, _, lines, rows = run_quick(
    tmp_path, '--config=configs/digits.py:smoke', '--topology', 'v5e:2x2', 'v9:2x2'
  )
  assert code == 2 and rows is None
  assert lines == [lines[0]] and lines[0].startswith('error: --topology v9:2x2: not a TPU topology')


def test_a_topology_libtpu_refuses_is_one_line_and_exit_2(tmp_path):
  code, _, lines, rows = run_quick(
    tmp_path, '--config=configs/digits.py:smoke', '--topology', 'v5e:3x3'
  )
  assert code == 2 and rows is None and len(lines) == 1
  assert lines[0].startswith('error: --topology v5e:3x3: libtpu refuses it')


def test_a_bad_config_is_the_same_one_line_as_train_py(tmp_path):
  code, _, lines, _ = run_quick(
    tmp_path, '--config=configs/digits.py:smoke', '--config.batch_size=0', '--topology', 'v5e:2x2'
  )
  assert code == 2 and lines == ['error: config.batch_size must be a positive integer, got 0']


def test_without_libtpu_one_line_says_what_to_install(tmp_path):
  """libtpu made unimportable in the child (a None entry in sys.modules)."""
  hide = (
    "import sys; sys.modules['libtpu'] = None; from sweeps import preflight; "
    'sys.exit(preflight.main(sys.argv[1:]))'
  )
  proc = subprocess.run(
    [sys.executable, '-c', hide, '--config=configs/digits.py:smoke', '--topology', 'v5e:2x2'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
    timeout=300,
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1
  assert (
    lines[0].startswith('error: libtpu is not installed') and 'requirements-tpu.txt' in lines[0]
  )


def test_an_evaluation_batch_over_16_gib_does_not_fit_and_says_how_much(tmp_path):
  """An evaluation batch whose activations' lower bound (train.py's check, 13.8 GiB) passes but
  whose program does not fit: the compiler refuses it, its message gives the memory it needs (at
  16384 train.py's own check refuses it first, as in the next test)."""
  code, stdout, _, rows = run_quick(
    tmp_path,
    '--config=configs/celeba.py:smoke',
    '--config.data.image_size=224',
    '--config.batch_size=8',
    '--config.eval_batch_size=8192',
    '--topology',
    'v5e-1',
    '--programs',
    'eval',
  )
  assert code == 1
  (row,) = rows
  assert row['compiled'] == 'False' and row['fits'] == 'False'
  assert 'RESOURCE_EXHAUSTED' in row['reason'] and float(row['memory_per_chip_gib']) > 16
  assert 'does not fit' in stdout


def test_a_training_batch_over_16_gib_does_not_fit_and_says_how_much(tmp_path):
  """Refused before compiling, by train.py's own check: its activations' lower bound."""
  code, _, _, rows = run_quick(
    tmp_path,
    '--config=configs/digits.py:smoke',
    '--config.data.image_size=224',
    '--config.model.width=1.0',
    '--config.batch_size=1024',
    '--topology',
    'v5e:2x2',
  )
  assert code == 1
  (row,) = rows
  assert row['fits'] == 'False' and row['hbm_per_chip_gib'] == '16'
  assert float(row['memory_per_chip_gib']) == pytest.approx(28.7, abs=0.05)
  assert 'config.batch_size' in row['reason']


def test_max_batch_search_compiles_larger_batches(tmp_path):
  """Two search compiles after the configured batch's: 64 fits, 128 fits, 256 fits."""
  code, stdout, _, rows = run_quick(
    tmp_path,
    '--config=configs/digits.py:smoke',
    '--topology',
    'v5e:2x2',
    '--programs',
    'full',
    '--max-batch',
    '--max-compiles',
    '3',
  )
  assert code == 0, stdout[-2000:]
  assert rows[0]['max_batch'] == '256'
  assert 'batch 256:' in stdout and 'largest batch that fits: 256 (3 compiles)' in stdout


ONE_ARM = """from configs import digits
get_config = digits.get_config
def get_sweep(arg=None):
  return [{'numerics.profile': 'f32', 'seed': seed} for seed in range(3)]
"""


def test_sweep_estimate_prices_each_arm_from_its_compiled_tpu_program(tmp_path):
  """`sweeps.sweep --estimate --estimate-tpu`: one arm of 3 seeds of the smoke config, its
  programs compiled for one v5e chip (the preflight's run hours, times 3)."""
  config = tmp_path / 'one_arm.py'
  config.write_text(ONE_ARM)
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'sweeps.sweep',
      f'--config={config}:smoke',
      f'--root={tmp_path / "root"}',
      '--estimate',
      '--estimate-tpu',
      'v5e-1',
      '--tpu-chips',
      '0,1',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  from sweeps import tpu

  (arm,) = [line for line in proc.stdout.splitlines() if line.startswith('estimate: profile-f32: ')]
  assert arm.startswith('estimate: profile-f32: 3 runs x ')
  assert all(f'{term} ' in arm for term in tpu.TERMS), arm
  total = next(line for line in proc.stdout.splitlines() if line.startswith('total: '))
  assert float(total.split()[1]) > 0 and 'run-hours on v5e-1' in total
  assert 'at 2 run(s) at a time (--tpu-chips)' in total  # the chips the sweep uses
  assert all(f'  {term}: {source}' in proc.stdout for term, source in tpu.TERMS.items())


def test_a_product_the_compiler_computes_otherwise_than_asked_is_counted_out(tmp_path):
  """matmul_precision BF16_BF16_F32_X3 (three bf16 passes in the dense products; convolutions
  ignore presets): in the TPU program the backward dense products carry `high` (three passes),
  but the forward one takes a bf16 operand at the default precision, one pass. The census says
  so: one product not as configured."""
  code, stdout, _, rows = run_quick(
    tmp_path,
    '--config=configs/digits.py:smoke',
    '--config.numerics.matmul_precision=BF16_BF16_F32_X3',
    '--topology',
    'v5e:2x2',
    '--programs',
    'full',
  )
  assert code == 0, stdout[-2000:]
  (row,) = rows
  assert row['configured'] == 'conv @ default; dense @ dot_bf16_bf16_f32_x3'
  assert int(row['products_as_configured']) == int(row['products']) - 1
  assert 'dense backward f32 x f32 @ high: 2' in row['product_breakdown']
  assert 'dense forward bf16 x f32 @ default: 1' in row['product_breakdown']


def test_out_as_a_link_to_a_users_folder_is_written_through_and_the_rest_left(tmp_path):
  """--out a symlink to a folder holding a user's 600 file: the link kept, preflight.csv in its
  target, the user's file byte for byte; run again, its own CSV is rewritten."""
  real, link = tmp_path / 'real', tmp_path / 'link'
  real.mkdir()
  (real / 'notes.txt').write_text('my own notes\n')
  os.chmod(real / 'notes.txt', 0o600)
  os.symlink(real, link)
  argv = ['--config=configs/digits.py:smoke', '--topology', 'v5e:2x2', '--programs', 'eval']
  for _ in range(2):
    proc = subprocess.run(
      [sys.executable, '-m', 'sweeps.preflight', *argv, '--out', str(link)],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
      env={**os.environ, 'PYTHONPATH': ROOT},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.readlink(link) == str(real) and (real / 'notes.txt').read_text() == 'my own notes\n'
    assert os.stat(real / 'notes.txt').st_mode & 0o777 == 0o600
    (row,) = csv.DictReader(open(real / 'preflight.csv'))
    assert row['phase'] == 'eval' and row['compiled'] == 'True'


@pytest.mark.parametrize(
  'name, chips, hosts',
  [
    ('v5e-16', 16, 2),
    ('v6e-16', 16, 2),
    ('v5litepod-8', 8, 1),
    ('v6e-8', 8, 1),
    ('v4-8', 4, 1),
    ('v4-16', 8, 2),
    ('v5p-8', 4, 1),
    ('v5e:2x4', 8, 2),  # libtpu's name: its default hosts of 2x2x1
  ],
)
def test_accelerator_types_compile_on_googles_hosts(name, chips, hosts):
  """v5e and v6e: 8 chips per host, v4 and v5p: 4 (docs/tpu.md); before, v5e-16 was 4 hosts of 4."""
  from sweeps import tpu

  facts = tpu.facts(tpu.devices(tpu.parse_topology(name)))
  assert (facts['chips'], facts['hosts']) == (chips, hosts)


@pytest.mark.parametrize('topology, batch', [('v5e-8', 4056), ('v4-8', 4052)])
def test_the_eval_program_is_compiled_at_the_batch_a_run_evaluates_in(topology, batch):
  """Before: compiled at config.eval_batch_size (4096); a run evaluates in batches of one size, a
  multiple of the devices (trainer/run.py eval_batch)."""
  from configs import common, validation
  from sweeps import preflight, tpu

  config = validation.resolve(common.load('configs/celeba.py:tpu', []))
  t = tpu.parse_topology(topology)
  ctx = preflight.build_context(config, t, tpu.devices(t))
  name, _, args, images = preflight.programs(ctx)[-1]
  assert (name, images, args[1]['image'].shape[0]) == ('eval', batch, batch)


def test_a_runs_hours_add_every_term_the_roofline_leaves_out():
  """CelebA on v5e-8 at the roofline step times of docs/tpu.md: every term non-zero, each source
  named (measured here, compiled or assumed); before, a run was the roofline alone (149 s)."""
  from configs import common, validation
  from sweeps import preflight, tpu

  config = validation.resolve(common.load('configs/celeba.py:tpu', []))
  t = tpu.parse_topology('v5e-8')
  ctx = preflight.build_context(config, t, tpu.devices(t))
  step_s = {'frozen': 0.0662, 'full': 0.075, 'eval': 0.0183}
  terms = tpu.run_terms(ctx, step_s, dict.fromkeys(step_s, 300.0), 20.0, hosts=1)
  assert list(terms) == list(tpu.TERMS) and all(v > 0 for v in terms.values()), terms
  assert terms['compilation'] == 900 and terms['startup'] == 20
  assert all(
    source.split(':')[0] in ('measured here', 'compiled', 'assumed')
    for source in tpu.TERMS.values()
  )
  assert tpu.readable(1.39e-06 * 3600) == '5 ms' and tpu.readable(7390) == '2h03m10s'


def test_out_is_checked_before_compiling_and_a_topology_named_twice_compiles_once(tmp_path):
  """Before: a bad --out died with a traceback after every compile; a topology named twice (or by
  two names) was compiled twice."""
  (tmp_path / 'a_file').write_text('not a folder')
  os.symlink(tmp_path / 'a_file' / 'below', tmp_path / 'link')
  argv = [sys.executable, '-m', 'sweeps.preflight', '--config=configs/digits.py:smoke']
  argv += ['--topology', 'v5e-1', 'v5litepod-1', 'v5e-1', '--programs', 'eval', '--out']
  env = {**os.environ, 'PYTHONPATH': ROOT}
  bad = subprocess.run(
    [*argv, str(tmp_path / 'link')], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
  )
  lines = bad.stderr.strip().splitlines()
  assert (bad.returncode, len(lines)) == (2, 1) and 'cannot write there' in lines[0], bad.stderr
  assert 'compiling' not in bad.stdout
  os.symlink(tmp_path / 'not_yet' / 'out', tmp_path / 'dangling')  # followed: made, written
  good = subprocess.run(
    [*argv, str(tmp_path / 'dangling')],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert good.returncode == 0, good.stderr[-2000:]
  assert good.stdout.count('[preflight]   compiling ') == 1
  assert (tmp_path / 'not_yet' / 'out' / 'preflight.csv').exists()
  assert 'e-0' not in good.stdout.split('| topology |')[1]  # no '1.39e-06 h'
