"""Arms declared with different split seeds (issue 36's leftover): `data.split_seed` may differ
between arms (another test split is a legitimate arm), but the predictions of two runs on
different test sets do not compare image by image. Before: the whole analysis stopped at
agreement.pair_churn with one `error:` line. Now each such pair of runs is left out of the churn,
counted on the first page with its reason, and everything else is analysed. Planted run folders
(Orbax results and predictions items, no training) and planted predictions."""

import os

import numpy as np
import orbax.checkpoint as ocp
import pandas as pd
import pytest

from analysis import agreement, analyse
from runrecord import record

N, CLASSES, SEEDS = 200, 10, (0, 1, 2)
FINGERPRINTS = {0: 'f00d0000f00d0000', 7: 'beef0000beef0000'}  # the test split of each split seed


def labels(split_seed):
  """The test labels of the split drawn with `split_seed` (other images, other labels)."""
  return np.random.default_rng(100 + split_seed).integers(0, CLASSES, N).astype(np.int32)


def moved(base, count, rng):
  """`base` with exactly `count` images moved to another class."""
  out = base.copy()
  idx = rng.choice(len(base), count, replace=False)
  out[idx] = (out[idx] + 1) % CLASSES
  return out


def item(predicted, split_seed):
  label, p = labels(split_seed), np.full(N, 0.9, np.float32)
  return {
    'label': label,
    'predicted': predicted.astype(np.int32),
    'p_predicted': p,
    'p_label': np.where(predicted == label, p, 0.01).astype(np.float32),
    'task': 'classification',
    'fingerprint': FINGERPRINTS[split_seed],
  }


def results(seed, dtype, split_seed, acc):
  numerics = {
    'matmul_precision': 'highest',
    'compute_dtype': dtype,
    'param_dtype': 'float32',
    'batchnorm_group': 0,
    'gpu_deterministic': True,
  }
  hist = [
    {
      'epoch': e,
      'step': 5 * e,
      'test_accuracy': acc,
      'test_loss': 1.0,
      'train_loss': 0.5,
      'lr': 0.01,
      'wall_time': float(e),
    }
    for e in (1, 2)
  ]
  return {
    'status': 'completed',
    'reason': '',
    'seed': seed,
    'platform': 'cpu',
    'device_kind': 'cpu',
    'num_devices': 1,
    'num_processes': 1,
    'numerics': {'requested': numerics, 'effective': numerics},
    'final': {'test_accuracy': acc, 'test_loss': 1.0, 'train_loss': 0.1},
    'history': hist,
    'config': {
      'seed': seed,
      'num_epochs': 2,
      'numerics': numerics,
      'data': {'name': 'digits', 'image_size': 8, 'split_seed': split_seed},
    },
    'versions': {'jax': 'x'},
    'wall_time_s': 1.0,
    'step': 10,
    'total_steps': 10,
    'data': {
      'name': 'digits',
      'train_size': 800,
      'test_size': N,
      'split_fingerprint': FINGERPRINTS[split_seed],
    },
  }


def plant(run, res, pred):
  """A completed run folder whose step 10 holds `res` and the predictions `pred`."""
  names = record.ITEMS + (record.PREDICTIONS_ITEM,)
  with ocp.CheckpointManager(os.path.abspath(record.checkpoint_dir(run)), item_names=names) as mngr:
    record.save(mngr, 10, res, extra=record.predictions_save_args(pred))
    mngr.wait_until_finished()


# The three arms: float32 and bfloat16 on split seed 0, float32 on split seed 7. Seed s of
# bfloat16 predicts exactly BF16_MOVED of the N images differently from seed s of float32 (0).
BF16_MOVED = 20
ARMS = (('float32', 0), ('bfloat16', 0), ('float32', 7))


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  path = tmp_path_factory.mktemp('split_seeds')
  rng = np.random.default_rng(5)
  for seed in SEEDS:
    base = {s: moved(labels(s), 30, rng) for s in FINGERPRINTS}
    preds = {
      ('float32', 0): base[0],
      ('bfloat16', 0): moved(base[0], BF16_MOVED, rng),
      ('float32', 7): base[7],
    }
    for dtype, split in ARMS:
      acc = 0.8 + 0.01 * seed + 0.002 * (dtype == 'bfloat16') + 0.003 * split
      plant(
        path / f'{dtype}_split{split}' / f's{seed}',
        results(seed, dtype, split, acc),
        item(preds[(dtype, split)], split),
      )
  return path


def test_the_analysis_runs_and_counts_the_pairs_on_different_test_sets(root, tmp_path, capsys):
  out = tmp_path / 'out'
  analyse.main(['--runs', str(root), '--out', str(out)])
  page = (out / 'report.md').read_text(encoding='utf-8').split('## Setup')[0]
  # every pair of arms is compared (no declaration): the two pairs that cross split seeds are left
  # out of the churn, 3 seeds each
  assert '6 pairs of runs on different test sets left out of the churn' in page, page
  assert 'split fingerprint f00d0000f00d0000 vs beef0000beef0000' in page, page
  table = pd.read_csv(out / 'report_agreement.csv')
  contrast = table[table['kind'] == 'contrast']
  assert len(contrast) == 1  # the pair on one split only
  # hand computation: BF16_MOVED of N images per seed, the same in every seed
  assert contrast['churn_pct'].iloc[0] == pytest.approx(100 * BF16_MOVED / N)
  assert set(contrast.iloc[0][['a', 'b']].str.contains('split_seed=7')) == {False}
  # the seed-to-seed churn of each arm is still there (one test set within an arm)
  assert len(table[table['kind'] == 'seed']) == 3
  # the accuracy tests compare the arms of another split unpaired (pairing fields differ)
  pairs = pd.read_csv(out / 'report_pairs.csv')
  crossing = pairs[
    pairs['arm_a'].str.contains('split_seed=7') | pairs['arm_b'].str.contains('split_seed=7')
  ]
  assert (
    len(crossing) == 2
    and crossing['design']
    .str.startswith('unpaired: pairing fields differ: config.data.split_seed')
    .all()
  )
  assert 'error' not in capsys.readouterr().err


def entry(arm, seed, pred):
  return {'run': f'/r/{arm}/{seed}', 'arm': arm, 'seed': seed, 'platform': 'cpu', 'pred': pred}


def test_a_pair_on_two_test_sets_is_left_out_and_named_not_raised():
  rng = np.random.default_rng(1)
  entries = []
  for seed in SEEDS:
    base = moved(labels(0), 30, rng)
    entries += [
      entry('a', seed, item(base, 0)),
      entry('b', seed, item(moved(base, 10, rng), 0)),
      entry('c', seed, item(moved(labels(7), 30, rng), 7)),
    ]
  left_out = []
  table = agreement.agreement_table(entries, pairs=[('a', 'b'), ('a', 'c')], left_out=left_out)
  contrast = table[table['kind'] == 'contrast']
  assert list(zip(contrast['a'], contrast['b'], strict=True)) == [('a', 'b')]
  assert contrast['churn_pct'].iloc[0] == pytest.approx(100 * 10 / N)
  assert [(p['a'], p['b'], p['run_a']) for p in left_out] == [
    ('a', 'c', f'/r/a/{s}') for s in SEEDS
  ]
  assert agreement.left_out_text(left_out, {'c': 'split 7'}) == (
    '3 pairs of runs on different test sets left out of the churn (a vs split 7: split '
    'fingerprint f00d0000f00d0000 vs beef0000beef0000, 3 pairs)'
  )
  # one seed of an arm on another test set: that seed leaves the row, the others stay
  mixed = [
    e if not (e['arm'] == 'b' and e['seed'] == 2) else {**e, 'pred': item(labels(7), 7)}
    for e in entries
    if e['arm'] != 'c'
  ]
  left_out = []
  row = agreement.agreement_table(mixed, pairs=[('a', 'b')], left_out=left_out)
  row = row[row['kind'] == 'contrast'].iloc[0]
  assert row['seeds'] == 2 and row['seed_list'] == '0, 1' and len(left_out) == 1
  # the churn of two runs on different test data is still refused when asked for directly
  with pytest.raises(ValueError, match='predict different test data'):
    agreement.pair_churn(entries[0], entries[2])
