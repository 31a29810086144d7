"""experiments/divergence: two numerics arms trained in lockstep from bit-identical weights.

Tiny: the digits `smoke` preset (width 0.125, 8x8 images), a few steps, one device.
"""

import json
import math
import os

import jax
import numpy as np
import pytest
from PIL import Image

from configs import loader
from experiments import divergence
from trainer import checkpointing, loop, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, 'configs', 'digits.py') + ':smoke'
TINY = ['--steps', '4', '--every', '2', '--probe', '64', '--devices', '1']
BACKBONE = ('layer1', 'layer2', 'layer3', 'layer4')


def run_main(argv):
  """divergence.main(argv), leaving the process-wide precision flag as it was."""
  before = jax.config.jax_default_matmul_precision
  try:
    return divergence.main(argv)
  finally:
    jax.config.update('jax_default_matmul_precision', before)


@pytest.fixture(scope='module')
def f32_vs_bf16(tmp_path_factory):
  out = tmp_path_factory.mktemp('f32_vs_bf16')
  code = run_main([f'--config={SMOKE}', '--a', 'numerics.emulate=f32', '--b',
                   'numerics.emulate=bf16', '--out', str(out), *TINY])
  with open(out / 'divergence.json', encoding='utf-8') as f:
    return code, out, json.load(f)


def test_f32_vs_bf16_grows_from_zero(f32_vs_bf16):
  code, _, result = f32_vs_bf16
  assert code == 0
  rows = result['records']
  assert [r['step'] for r in rows] == [0, 2, 4]
  assert rows[0]['params']['rel_l2'] == 0.0 and rows[0]['params']['max_abs'] == 0.0
  assert rows[0]['batch_stats']['max_abs'] == 0.0
  assert rows[0]['logits']['rel_l2'] > 0  # same weights, different arithmetic
  distances = [r['params']['rel_l2'] for r in rows]
  assert 0 < distances[1] < distances[2] < 1e-2, distances
  for r in rows[1:]:
    # The smoke preset's first epoch is the frozen phase: the backbone stays bit-identical.
    assert all(r['params']['groups'][g]['rel_l2'] == 0.0 for g in BACKBONE), r['params']['groups']
    assert r['params']['groups']['stem']['rel_l2'] > 0
    assert r['params']['groups']['head']['rel_l2'] > 0
    assert abs(r['loss_a'] - r['loss_b']) < 0.01 * r['loss_a']
  effective = {n: result['arms'][n]['numerics']['effective'] for n in 'ab'}
  assert (effective['a']['conv_format'], effective['b']['conv_format']) == ('f32', 'bf16')


def test_per_group_breakdown_sums_to_overall(f32_vs_bf16):
  for r in f32_vs_bf16[2]['records']:
    p, groups = r['params'], r['params']['groups']
    assert list(groups) == list(divergence.GROUPS)
    assert math.isclose(sum(g['diff_norm'] ** 2 for g in groups.values()), p['diff_norm'] ** 2,
                        rel_tol=1e-9, abs_tol=0)
    assert math.isclose(sum(g['norm_a'] ** 2 for g in groups.values()), p['norm_a'] ** 2,
                        rel_tol=1e-9)
    assert p['rel_l2'] == pytest.approx(p['diff_norm'] / p['norm_a'], rel=1e-12)


def test_param_distance_by_hand():
  rng = np.random.default_rng(0)
  a = {'conv1': {'kernel': rng.standard_normal((3, 3, 1, 2)).astype(np.float32)},
       'bn1': {'scale': np.ones(2, np.float32)},
       'layer1': {0: {'conv1': {'kernel': rng.standard_normal((3, 3, 2, 2)).astype(np.float32)}}},
       'fc': {'kernel': rng.standard_normal((2, 3)).astype(np.float32)}}
  b = jax.tree.map(lambda x: x.copy(), a)
  b['layer1'][0]['conv1']['kernel'][0, 0, 0, 0] += 0.5
  b['bn1']['scale'][1] = -1.0
  out = divergence.param_distance(a, b)
  flat_a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(a)]).astype(np.float64)
  flat_b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(b)]).astype(np.float64)
  assert out['rel_l2'] == pytest.approx(np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_a))
  assert out['max_abs'] == 2.0
  stem_norm = np.sqrt(np.sum(np.square(a['conv1']['kernel'], dtype=np.float64)) + 2.0)
  assert out['groups']['stem']['rel_l2'] == pytest.approx(2.0 / stem_norm)
  assert out['groups']['layer1']['diff_norm'] == pytest.approx(0.5)
  assert out['groups']['head']['diff_norm'] == 0.0
  assert list(out['groups']) == ['stem', 'layer1', 'head']


def test_outputs_written_and_png_opens(f32_vs_bf16):
  _, out, result = f32_vs_bf16
  for name in ('divergence.json', 'divergence.md', 'divergence.png', 'divergence.pdf'):
    assert (out / name).stat().st_size > 0, name
  with Image.open(out / 'divergence.png') as image:
    image.load()
    assert image.size[0] > 500 and image.size[1] > 300
  assert (out / 'divergence.pdf').read_bytes().startswith(b'%PDF')
  text = (out / 'divergence.md').read_text(encoding='utf-8')
  assert 'a = emulate=f32 vs b = emulate=bf16' in text
  assert text.count('\n| ') == 1 + len(result['records'])  # header + one row per record


def test_identical_settings_give_exactly_zero(tmp_path, capsys):
  code = run_main([f'--config={SMOKE}', '--a', 'numerics.emulate=bf16', '--out', str(tmp_path),
                   *TINY[:2], '--every', '1', *TINY[4:]])
  assert code == 0
  result = json.loads((tmp_path / 'divergence.json').read_text(encoding='utf-8'))
  assert result['info']['identical_settings'] and result['info']['deterministic']
  assert [r['step'] for r in result['records']] == [0, 1, 2, 3, 4]
  for r in result['records']:
    assert r['params']['rel_l2'] == 0.0 and r['params']['max_abs'] == 0.0
    assert all(g['diff_norm'] == 0.0 for g in r['params']['groups'].values())
    assert r['batch_stats']['max_abs'] == 0.0
    assert r['logits']['max_abs'] == 0.0 and r['logits']['pred_differs'] == 0.0
    assert r['step'] == 0 or r['loss_a'] == r['loss_b']
  assert 'determinism check: passed' in capsys.readouterr().out


def test_matmul_precision_arms_lower_to_different_hlo():
  config = divergence.load_config(SMOKE)
  arms = [divergence.arm_config(config, {'numerics.matmul_precision': p}, f)
          for p, f in (('default', '--a'), ('highest', '--b'))]
  lock = divergence.prepare(*arms, devices=1)
  fns = divergence.enter_phase(lock, lock['ctx'].phases[0], 0)
  batch = divergence.global_batch(lock, 0)
  # Lowered outside any precision context: each arm's step fixes its own precision inside.
  texts = {name: fns[name].lower(lock['states'][name], batch).as_text() for name in 'ab'}
  assert fns['a'] is not fns['b'] and texts['a'] != texts['b']
  dots = {n: [l for l in t.splitlines() if 'dot_general' in l] for n, t in texts.items()}
  assert dots['a'] and all('HIGHEST' not in l for l in dots['a'])
  assert dots['b'] and all('HIGHEST' in l for l in dots['b'])
  assert lock['arms']['b']['numerics']['effective']['matmul_precision_flag'] == 'highest'


@pytest.mark.parametrize('argv,expect', [
    (['--config=configs/nope.py', '--a', 'emulate=f32'], '--config: no file configs/nope.py'),
    (['--a', 'model.width=0.5'], '--a: model.width is not a numerics field'),
    (['--a', 'emulate'], '--a=emulate: give numerics.<field>=<value>'),
    (['--a', 'emulate=fp8'], '--a: config.numerics.emulate must be one of'),
    (['--a', 'emulate=f32', '--b', 'numerics.nope=1'], '--b: unknown config field numerics.nope'),
    (['--a', 'emulate=f32', '--b', 'gpu_deterministic=True'], '--b: numerics.gpu_deterministic is'),
    (['--a', 'emulate=f32', '--steps', '0'], '--steps=0: give a positive integer'),
    (['--a', 'emulate=f32', '--every', 'x'], "argument --every: invalid int value: 'x'"),
    (['--a', 'emulate=f32', '--config.model.nope=1'], '--config.model.nope: unknown config field'),
    (['--a', 'emulate=f32', '--config.batch_size=0'], 'config.batch_size must be a positive'),
    (['--a', 'emulate=f32', '--bogus'], 'unrecognized argument --bogus'),
    (['--a', 'emulate=f32', '--devices', '3'], '--devices=3: give 0'),
    (['--a', 'emulate=f32', '--steps', '100000'], '--steps=100000: give 1..44'),
    (['--a', 'param_dtype=float32', '--b', 'param_dtype=bfloat16'],
     'parameter bn1.bias is float32[8] in arm a, bfloat16[8] in arm b'),
])
def test_bad_arguments_rejected(argv, expect, tmp_path, capsys):
  if not any(a.startswith('--config=') for a in argv):
    argv = [f'--config={SMOKE}', *argv]
  with pytest.raises(SystemExit) as exit_info:
    run_main([*argv, '--out', str(tmp_path / 'out')])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert expect in err and '\n' not in err, err
  assert not (tmp_path / 'out').exists()


def test_arm_a_is_bit_identical_to_train_py(tmp_path):
  """The divergence tool's arm a, N steps, and train.py's run of the same config for N steps
  (through the frozen phase into the unfrozen one, with its optimizer reset): the same parameters,
  bit for bit. Both build their training from trainer/run.py."""
  overrides = [('num_epochs', '2'), ('optim.freeze_epochs', '1'), ('batch_size', '256'),
               ('eval_batch_size', '512'), ('model.width', '0.0625')]
  config = loader.load(SMOKE, overrides)
  arms = [divergence.arm_config(config, {'numerics.emulate': 'bf16'}, f) for f in ('--a', '--b')]
  lock = divergence.prepare(*arms, devices=0)
  steps_total = lock['ctx'].total_steps
  divergence.train(lock, steps_total, every=steps_total, probe=8)
  trained = loop.train_and_evaluate(arms[0], str(tmp_path / 'run'))
  assert trained['status'] == 'completed' and trained['step'] == steps_total
  mngr = checkpointing.manager(str(tmp_path / 'run'), 1)
  abstract = checkpointing.abstract(lock['states']['a'])
  state, _ = checkpointing.restore(mngr, steps_total, abstract)
  mngr.close()
  ours, theirs = (divergence.flat(jax.device_get(s['params'])) for s in (lock['states']['a'], state))
  assert ours.keys() == theirs.keys()
  for name in ours:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  assert int(state['step']) == steps_total and record.CHECKPOINTS == 'checkpoints'
