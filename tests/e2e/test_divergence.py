"""experiments/divergence: numerics arms and seeds trained in lockstep from bit-identical weights
(its parts, mostly without training: tests/e2e/test_divergence_parts.py).

Tiny: the digits `smoke` preset (width 0.125, 8x8 images), a few steps, one device.
"""

import json
import math
import os
import re

import jax
import numpy as np
import pytest
from PIL import Image

from configs import common
from experiments import divergence, lockstep
from runrecord import record
from tests.support.divergence_runs import SMOKE, run_main
from trainer import checkpoint, train

TINY = ['--steps', '4', '--every', '2', '--probe', '64', '--devices', '1']


BACKBONE = ('layer1', 'layer2', 'layer3', 'layer4')


CONTROL, CONTROL_FORMAT = 'numerics.profile=bf16_noise', 'bf16_noise'  # the default control


@pytest.fixture(scope='module')
def f32_vs_bf16(tmp_path_factory):
  """Two seeds, arms a (f32), b (bf16) and the control (bf16_noise)."""
  out = tmp_path_factory.mktemp('f32_vs_bf16')
  code = run_main(
    [
      f'--config={SMOKE}',
      '--a',
      'numerics.profile=f32',
      '--b',
      'numerics.profile=tpu_default',
      '--control',
      CONTROL,
      '--seeds',
      '3',
      '5',
      '--out',
      str(out),
      *TINY,
    ]
  )
  with open(out / 'divergence.json', encoding='utf-8') as f:
    return code, out, json.load(f)


def pair_rows(result, kind):
  """[[pair row per recorded step] per pair] of one pair kind."""
  rows = result['records']
  return [[r['pairs'][kind][i] for r in rows] for i in range(len(rows[0]['pairs'][kind]))]


def test_f32_vs_bf16_grows_from_zero(f32_vs_bf16):
  code, _, result = f32_vs_bf16
  assert code == 0
  assert result['steps'] == [r['step'] for r in result['records']] == [0, 2, 4]
  assert result['info']['seeds'] == [3, 5] and result['info']['steps'] == 4
  for rows in pair_rows(result, 'b'):
    assert rows[0]['params']['rel_l2'] == 0.0 and rows[0]['params']['max_abs'] == 0.0
    assert rows[0]['batch_stats']['max_abs'] == 0.0
    assert rows[0]['logits']['rel_l2'] > 0  # same weights, different arithmetic
    distances = [r['params']['rel_l2'] for r in rows]
    assert 0 < distances[1] < distances[2] < 1e-2, distances
    for r in rows[1:]:
      # The smoke preset's first epoch is the frozen phase: the backbone stays bit-identical.
      assert all(r['params']['groups'][g]['rel_l2'] == 0.0 for g in BACKBONE), r['params']
      assert r['params']['groups']['stem']['rel_l2'] > 0
      assert r['params']['groups']['head']['rel_l2'] > 0
  # Not an order bound: the arms differ in format. bf16 operands (each rounded by <= 2^-9) move
  # a tiny ResNet's training loss by ~1e-3 relative (tests/integration/test_numerics.py,
  # test_resnet_emulate_bf16_changes_by_expected_magnitude: < 3e-2 there); 1% after 4 steps.
  for r in result['records'][1:]:
    for loss_a, loss_b in zip(r['loss']['a'], r['loss']['b'], strict=True):
      assert abs(loss_a - loss_b) < 0.01 * loss_a
  effective = {n: result['arms'][n]['numerics']['effective'] for n in 'ab'}
  assert (effective['a']['conv_format'], effective['b']['conv_format']) == ('f32', 'bf16')


def test_control_arm_runs(f32_vs_bf16):
  result = f32_vs_bf16[2]
  assert result['arms']['control']['overrides'] == {'numerics.profile': CONTROL.split('=')[1]}
  assert result['arms']['control']['numerics']['effective']['conv_format'] == CONTROL_FORMAT
  rows = pair_rows(result, 'control')
  assert [r[0]['seeds'] for r in rows] == [[3, 3], [5, 5]]
  for r in rows:
    assert r[0]['params']['max_abs'] == 0.0  # the seed's initial weights, bit for bit
    assert r[-1]['params']['rel_l2'] > 0 and r[-1]['logits']['rel_l2'] > 0
  assert len(result['final']['accuracy']['control']['per_seed']) == 2


def test_ceiling_pair_is_arm_a_of_another_seed(f32_vs_bf16):
  result = f32_vs_bf16[2]
  (rows,) = pair_rows(result, 'ceiling')  # two seeds: one pair
  assert rows[0]['seeds'] == [3, 5]
  assert rows[0]['params']['rel_l2'] > 0.5  # different initial weights from the start

  def distance(kind):
    return np.mean([r[-1]['params']['rel_l2'] for r in pair_rows(result, kind)])

  assert distance('ceiling') > 100 * distance('b')
  assert result['final']['disagreement']['ceiling']['pairs'][0]['seeds'] == [3, 5]


def test_curves_are_bands_over_seeds(f32_vs_bf16):
  result = f32_vs_bf16[2]
  for kind in ('b', 'control', 'ceiling'):
    for name, get in lockstep.CURVES.items():
      for i, r in enumerate(result['records']):
        values = np.array([get(p) for p in r['pairs'][kind]], float)
        band = result['curves'][kind][name][i]
        assert band['n'] == len(values) == (1 if kind == 'ceiling' else 2)
        assert band['mean'] == pytest.approx(values.mean(), rel=1e-12, abs=0)
        assert (band['min'], band['max']) == (values.min(), values.max())
  losses = [r['loss']['b'] for r in result['records']]
  assert [b['mean'] for b in result['losses']['b'][1:]] == pytest.approx(
    [np.mean(run_losses) for run_losses in losses[1:]]
  )


def test_per_group_breakdown_sums_to_overall(f32_vs_bf16):
  for r in f32_vs_bf16[2]['records']:
    for p in (p for pairs in r['pairs'].values() for p in pairs):
      p, groups = p['params'], p['params']['groups']
      assert list(groups) == list(lockstep.GROUPS)
      assert math.isclose(
        sum(g['diff_norm'] ** 2 for g in groups.values()),
        p['diff_norm'] ** 2,
        rel_tol=1e-9,
        abs_tol=0,
      )
      assert math.isclose(
        sum(g['norm_a'] ** 2 for g in groups.values()), p['norm_a'] ** 2, rel_tol=1e-9
      )
      assert p['rel_l2'] == pytest.approx(p['diff_norm'] / p['norm_a'], rel=1e-12)


def test_outputs_written_and_png_opens(f32_vs_bf16):
  _, out, result = f32_vs_bf16
  for name in ('divergence.json', 'divergence.md', 'divergence.png', 'divergence.pdf'):
    assert (out / name).stat().st_size > 0, name
  with Image.open(out / 'divergence.png') as image:
    image.load()
    assert image.size[0] > 500 and image.size[1] > 300
  assert (out / 'divergence.pdf').read_bytes().startswith(b'%PDF')
  text = (out / 'divergence.md').read_text(encoding='utf-8')
  assert 'a = profile=f32 vs b = profile=tpu_default' in text
  assert 'min–max over seeds' in text and '95% Wilson score interval' in text
  assert lockstep.ACROSS_NAME in text
  # Tables: parameters and probe (a header and a row per recorded step), per group and final (a
  # header and a row per pair kind).
  assert text.count('\n| ') == 2 * (1 + len(result['records'])) + 2 * (1 + 3)
  total = result['final']['disagreement']['b']['total']
  assert f'{total["count"]} of {total["n"]}' in text and total['n'] == 2 * 360


def test_identical_settings_give_exactly_zero(tmp_path, capsys):
  """Written into --out, a symlink to a folder holding a user's 600 file: the link kept, the
  outputs in its target, the user's file byte for byte."""
  real, link = tmp_path / 'real', tmp_path / 'out'
  real.mkdir()
  (real / 'notes.txt').write_text('my own notes\n')
  os.chmod(real / 'notes.txt', 0o600)
  os.symlink(real, link)
  code = run_main(
    [
      f'--config={SMOKE}',
      '--a',
      'numerics.profile=tpu_default',
      '--control',
      'none',
      '--out',
      str(link),
      *TINY[:2],
      '--every',
      '1',
      *TINY[4:],
    ]
  )
  assert code == 0
  assert os.readlink(link) == str(real) and (real / 'notes.txt').read_text() == 'my own notes\n'
  assert os.stat(real / 'notes.txt').st_mode & 0o777 == 0o600
  assert {'divergence.md', 'divergence.png', 'divergence.pdf'} < set(os.listdir(real))
  result = json.loads((real / 'divergence.json').read_text(encoding='utf-8'))
  assert result['info']['identical_settings'] and result['info']['deterministic']
  assert result['info']['seeds'] == [0] and list(result['final']['disagreement']) == ['b']
  assert [r['step'] for r in result['records']] == [0, 1, 2, 3, 4]
  for r in result['records']:
    (p,) = r['pairs']['b']
    assert p['params']['rel_l2'] == 0.0 and p['params']['max_abs'] == 0.0
    assert all(g['diff_norm'] == 0.0 for g in p['params']['groups'].values())
    assert p['batch_stats']['max_abs'] == 0.0
    assert p['logits']['max_abs'] == 0.0 and p['logits']['pred_differs'] == 0.0
    assert r['step'] == 0 or r['loss']['a'] == r['loss']['b']
  assert result['final']['disagreement']['b']['total']['count'] == 0
  out = capsys.readouterr()
  assert 'determinism check: passed' in out.out
  # Progress from the start, compiles included (it printed nothing until the first row before).
  lines = [line for line in out.err.splitlines() if line.startswith('[')]
  assert lines[0] == f'[0m00s] loading {SMOKE}'
  assert [line.split('] ', 1)[1].split(':')[0].split(' (')[0] for line in lines[1:4]] == [
    'building seed 0 arm a',
    'building seed 0 arm b',
    'compiling the evaluation pass of 1 distinct arm(s), then the first row',
  ]
  assert 'compiling the training step of phase frozen for 1 distinct arm(s)' in lines[4]
  assert re.search(r'step 4/4, [0-9.e+]+ steps/s, ETA 0m00s \(frozen\)', out.err)


def test_arm_a_is_bit_identical_to_train_py(tmp_path):
  """The divergence tool's arm a, N steps, and train.py's run of the same config for N steps
  (through the frozen phase into the unfrozen one, with its optimizer reset): the same parameters,
  bit for bit. Both build their training from trainer/run.py."""
  overrides = [
    ('num_epochs', '2'),
    ('optim.freeze_epochs', '1'),
    ('batch_size', '256'),
    ('eval_batch_size', '512'),
    ('model.width', '0.0625'),
  ]
  config = common.load(SMOKE, overrides)
  configs = {
    config.seed: {
      n: divergence.arm_config(config, {'numerics.profile': 'tpu_default'}, f'--{n}', config.seed)
      for n in 'ab'
    }
  }
  lock = lockstep.prepare(configs, devices=0)
  steps_total = lock['ctx'].total_steps
  lockstep.train(lock, steps_total, every=steps_total, probe=8)
  trained = train.train_and_evaluate(configs[config.seed]['a'], str(tmp_path / 'run'))
  assert trained['status'] == 'completed' and trained['step'] == steps_total
  mngr = checkpoint.manager(str(tmp_path / 'run'), 1)
  ours = lock['states'][config.seed, 'a']
  abstract = checkpoint.abstract(ours)
  state, _ = checkpoint.restore(mngr, steps_total, abstract)
  mngr.close()
  ours, theirs = (lockstep.flat(jax.device_get(s['params'])) for s in (ours, state))
  assert ours.keys() == theirs.keys()
  for name in ours:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  assert int(state['step']) == steps_total and record.CHECKPOINTS == 'checkpoints'
