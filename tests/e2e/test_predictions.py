"""Per-example predictions in every run (runrecord/record.py), and the init/data seeds.

One-epoch digits smoke runs (22 steps, one phase): seed 0 native (the reference), seed 0 f32
(the same arithmetic on CPU), seed 0 tpu_default (bf16 products), seed 1, and seed 1 with
init_seed = data_seed = 0 (which must be the reference run itself).
"""

import collections

import jax
import numpy as np
import pandas as pd
import pytest
from flax import nnx

import input_pipeline
from configs import common, digits, validation
from input_pipeline import batching
from runrecord import record, rules
from sweeps import sweep
from tests.support import commands
from trainer import checkpoint, process, run, train

ONE_EPOCH = {'num_epochs': 1, 'optim.freeze_epochs': 0}
RUNS = {
  'native': {'numerics.profile': 'native'},
  'f32': {'numerics.profile': 'f32'},
  'bf16': {'numerics.profile': 'tpu_default'},
  'seed1': {'numerics.profile': 'native', 'seed': 1},
  'split': {'numerics.profile': 'native', 'seed': 1, 'init_seed': 0, 'data_seed': 0},
}
ARRAYS = record.PREDICTION_KEYS['classification']


def smoke_config(**overrides):
  config = digits.get_config('smoke')
  return validation.resolve(common.apply_overrides(config, {**ONE_EPOCH, **overrides}.items()))


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """{name: (workdir, results)} of the five runs, trained once per test session (also under
  pytest-xdist, whose workers would each train them again); nothing may write into them."""

  def make(root):
    for name, overrides in RUNS.items():
      train.train_and_evaluate(smoke_config(**overrides), str(root / name))

  root = commands.once_per_session(tmp_path_factory, 'predictions', make)
  return {name: (str(root / name), record.read_results(str(root / name))) for name in RUNS}


def saved(runs, name):
  return record.read_predictions(runs[name][0])


def churn(a, b):
  """The share of test examples two runs predict differently: mean(predicted_a != predicted_b)."""
  assert a['fingerprint'] == b['fingerprint'] and np.array_equal(a['label'], b['label'])
  return float(np.mean(a['predicted'] != b['predicted']))


def test_saved_predictions_hold_every_example_in_test_order(runs):
  workdir, results = runs['native']
  preds = saved(runs, 'native')
  n = results['data']['test_size']
  assert preds['step'] == results['step'] == 22 and record.saved_steps(workdir) == [22]
  assert preds['task'] == 'classification'
  assert preds['fingerprint'] == results['data']['split_fingerprint']
  assert {k: preds[k].dtype for k in ARRAYS} == {
    'label': np.int32,
    'predicted': np.int32,
    'p_predicted': np.float32,
    'p_label': np.float32,
  }
  assert all(preds[k].shape == (n,) for k in ARRAYS)  # the padded last batch dropped (360 < 512)
  dataset = run.load_dataset(smoke_config())
  assert np.array_equal(preds['label'], dataset.test.labels)
  assert np.mean(preds['predicted'] == preds['label']) == pytest.approx(
    results['final']['test_accuracy'], abs=1e-6
  )
  hit = preds['predicted'] == preds['label']
  assert np.array_equal(preds['p_predicted'][hit], preds['p_label'][hit])
  assert np.all(preds['p_predicted'][~hit] >= preds['p_label'][~hit])
  # The softmax cross-entropy of the label is -log p_label: its mean is the recorded test loss.
  assert np.mean(-np.log(preds['p_label'])) == pytest.approx(
    results['final']['test_loss'], rel=1e-4
  )


def test_saved_predictions_equal_those_of_the_restored_state(runs):
  """The state restored from the checkpoint, evaluated again: the saved arrays, bit for bit."""
  workdir, _ = runs['native']
  ctx = run.build(smoke_config(**RUNS['native']))
  abstract = checkpoint.abstract(train.initial_state(ctx, run.init_model(ctx)[0]))
  mngr = checkpoint.manager(workdir, 3)
  try:
    state, _ = checkpoint.restore(mngr, 22, abstract)
  finally:
    checkpoint.close(mngr)
  _, again = train.evaluate(ctx, train.eval_fn(ctx, state), state)
  preds = saved(runs, 'native')
  assert again['fingerprint'] == preds['fingerprint'] and again['task'] == preds['task']
  for key in ARRAYS:
    assert again[key].dtype == preds[key].dtype and np.array_equal(again[key], preds[key]), key


def test_churn_zero_for_identical_arithmetic_positive_across_seeds_and_formats(runs):
  """On CPU the native products are f32: the same model, every prediction and probability equal;
  another seed, or bf16 products, change some predictions."""
  native, f32 = saved(runs, 'native'), saved(runs, 'f32')
  assert churn(native, f32) == 0.0
  assert all(np.array_equal(native[k], f32[k]) for k in ARRAYS)
  assert churn(native, saved(runs, 'seed1')) > 0
  assert churn(saved(runs, 'f32'), saved(runs, 'bf16')) > 0


def test_init_and_data_seed_given_replace_the_seed(runs):
  """seed 1 with init_seed = data_seed = 0 is the seed 0 run bit for bit (the same state digest,
  the same predictions): unset, both are the seed; set, the seed drives nothing."""
  (_, reference), (_, split) = runs['native'], runs['split']
  assert split['state_digest'] == reference['state_digest']
  assert split['history'][0]['test_loss'] == reference['history'][0]['test_loss']
  assert all(np.array_equal(saved(runs, 'split')[k], saved(runs, 'native')[k]) for k in ARRAYS)
  assert (split['seed'], split['init_seed'], split['data_seed']) == (1, 0, 0)
  assert (reference['init_seed'], reference['data_seed']) == (0, 0)
  rows = [rules.row(n, runs[n][1]) for n in ('native', 'split', 'seed1')]

  def key(r):
    return tuple(r[c] for c in record.PAIRING_FIELDS if c in r)

  assert key(rows[0]) == key(rows[1]) != key(rows[2])


def test_a_step_or_record_without_predictions_reads_none(runs, tmp_path):
  workdir, results = runs['native']
  assert record.read_predictions(workdir, step=21) is None
  assert record.read_predictions(str(tmp_path / 'nothing')) is None
  old = tmp_path / 'old'
  record.write_results(str(old), results, step=22)
  assert record.read_results(str(old))['final'] == results['final']
  assert record.read_predictions(str(old)) is None
  assert record.read_predictions(str(old), step=22) is None


def test_init_seed_drives_only_the_weights_data_seed_only_the_data():
  """init_seed: the initial weights (those of seed=init_seed), not the data order nor the step
  seed; data_seed: the data order and the steps' seed (flips, product noise), not the weights."""
  base_ctx = run.build(smoke_config())

  def parts(**overrides):
    ctx = run.build(smoke_config(**overrides), base_ctx.dataset)
    model = run.init_model(ctx)[0]
    rows = batching.train_batch_indices(
      len(ctx.dataset.train), ctx.config.batch_size, common.data_seed_of(ctx.config), 3
    )
    step_seed = int(train.eval_fn(ctx, train.initial_state(ctx, model)).seed)
    return jax.tree.leaves(nnx.state(model)), rows, step_seed

  def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

  w0, rows0, s0 = parts()
  w_init, rows_init, s_init = parts(init_seed=5)
  w_data, rows_data, s_data = parts(data_seed=5)
  w5, rows5, s5 = parts(seed=5)
  assert same(w_init, w5) and not same(w_init, w0)
  assert np.array_equal(rows_init, rows0) and s_init == s0 == 0
  assert same(w_data, w0) and np.array_equal(rows_data, rows5) and s_data == s5 == 5
  assert not np.array_equal(rows_data, rows0)


def test_seed_fields_typed_and_named():
  config = digits.get_config('smoke')
  assert config.init_seed is None and config.data_seed is None and config.replicate == 0
  assert common.init_seed_of(config) == common.data_seed_of(config) == config.seed
  assert common.init_seed_of({'seed': 4}) == 4  # a saved config from before the fields
  common.apply_overrides(config, [('init_seed', '7')])
  assert config.init_seed == 7 and common.init_seed_of(config) == 7
  with pytest.raises(ValueError, match=r'^config\.data_seed=.abc.: give a int'):
    common.apply_overrides(config, [('data_seed', 'abc')])


def test_multilabel_predictions_are_bits_and_probabilities():
  """The attributes task: int8 labels and predicted bits (logit > 0), float32 sigmoid
  probabilities, [n, 40] in test order, the padding of the last batch dropped (11 = 8 + 3)."""
  config = common.load(
    'configs/celeba.py:smoke',
    [('data.task', 'attributes'), ('eval_batch_size', 8), ('batch_size', 8)],
  )
  config = validation.resolve(config)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (11, 16, 16, 3), dtype=np.uint8)
  labels = rng.integers(0, 2, (11, 40), dtype=np.int32)
  split = input_pipeline.Split(images, labels)
  dataset = input_pipeline.Dataset(
    'synthetic', split, split, 40, task='multilabel', info={'split_fingerprint': 'abc'}
  )
  ctx = run.build(config, dataset)
  state = train.initial_state(ctx, run.init_model(ctx)[0])
  metrics, preds = train.evaluate(ctx, train.eval_fn(ctx, state), state)
  assert preds['task'] == 'multilabel' and preds['fingerprint'] == 'abc'
  assert set(preds) == set(record.PREDICTION_KEYS['multilabel']) | {'task', 'fingerprint'}
  assert {k: (preds[k].dtype, preds[k].shape) for k in record.PREDICTION_KEYS['multilabel']} == {
    'label': (np.int8, (11, 40)),
    'predicted': (np.int8, (11, 40)),
    'probability': (np.float32, (11, 40)),
  }
  assert np.array_equal(preds['label'], labels)
  assert np.array_equal(preds['predicted'], (preds['probability'] > 0.5).astype(np.int8))
  assert np.mean(preds['predicted'] == preds['label']) == pytest.approx(
    metrics['test_accuracy'], abs=1e-6
  )
  logits = jax.jit(lambda s, x: train.eval_logits(ctx.graphdef, s, 0, x, ctx.mean, ctx.std))(
    state, images
  )
  # Not bit-exact: the eval step ran one example per device (eval batch 8 on 8 devices), this jit
  # all 11 on one, and XLA:CPU may order an output's sums differently for another batch shape (no
  # sum crosses examples in evaluation: only each layer's order differs, carried through the
  # network; no closed bound). Measured here: 1.2e-7 (2 ulps of a probability near 0.7); kept.
  np.testing.assert_allclose(preds['probability'], jax.nn.sigmoid(logits), rtol=1e-5, atol=1e-6)


def test_variance_preset_crosses_init_and_data_seeds_with_replicates_on_one_arm(tmp_path):
  """digits:variance runs every init seed with every data seed, REPLICATES times each: the
  replicates of a cell share its seed (repeated runs of one seed for the analysis), every run
  has its own folder, and all are one arm, the study's reference arm."""
  runs, _, _ = sweep.expand('configs/digits.py:variance', str(tmp_path))
  configs = [r.config for r in runs]
  assert not [r.problem for r in runs if r.problem] and len({r.workdir for r in runs}) == 18
  cells = collections.Counter((c.init_seed, c.data_seed) for c in configs)
  assert cells == {
    (i, d): digits.REPLICATES for i in range(digits.INIT_SEEDS) for d in range(digits.DATA_SEEDS)
  }
  cell_of_seed = collections.defaultdict(list)
  for c in configs:
    cell_of_seed[c.seed].append((c.init_seed, c.data_seed))
  assert len(cell_of_seed) == 9
  assert all(
    len(cell) == digits.REPLICATES and len(set(cell)) == 1 for cell in cell_of_seed.values()
  )
  rows = pd.DataFrame(
    [
      rules.row(
        r.workdir,
        record.new_record(
          r.config,
          process.execution_facts(),
          {'requested': r.config.numerics.to_dict()},
          {},
          {},
          {},
        ),
      )
      for r in runs
    ]
  )
  assert len(rows[rules.arm_columns(rows)].drop_duplicates()) == 1
  reference = validation.resolve(
    common.load('configs/digits.py:study', list(digits.study_arms(128)[0].items()))
  )
  assert all(c.numerics == reference.numerics for c in configs)
