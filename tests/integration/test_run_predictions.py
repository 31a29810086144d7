"""The predictions a verdict rests on (issue 36, case 1 and the damaged item): the agreement,
calibration and per-class sections read each run's predictions at the step its results came from,
and leave a run out of those sections only, with a counted reason on the first page. Planted run
folders (Orbax results and predictions items, no training)."""

import os
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest

from analysis import agreement, analyse, inputs
from runrecord import record
from tests.support.commands import run_module
from tests.support.planted_runs import fake_results
from tests.support.planted_saved_predictions import CLASSES, FINGERPRINT, LABELS, N, item


def moved(base, share, rng):
  """`base` with a share `share` of the images moved to another class."""
  out = base.copy()
  idx = rng.choice(N, int(round(share * N)), replace=False)
  out[idx] = (out[idx] + 1) % CLASSES
  return out


def plant(run, seed, dtype, items):
  """A completed run folder whose steps 5 and 10 hold results and `items` ({step: predictions})."""
  base = fake_results(seed, 0.8 + 0.01 * seed + 0.001 * (dtype == 'bfloat16'), dtype=dtype)
  base['data'] = {**base['data'], 'test_size': N, 'split_fingerprint': FINGERPRINT}
  names = record.ITEMS + (record.PREDICTIONS_ITEM,)
  with ocp.CheckpointManager(os.path.abspath(record.checkpoint_dir(run)), item_names=names) as mngr:
    for step in (5, 10):
      record.save(
        mngr,
        step,
        {**base, 'step': step, 'wall_time_s': float(step)},
        extra=record.predictions_save_args(items.get(step)),
      )
    mngr.wait_until_finished()


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  """Arms float32 and bfloat16 x seeds 0-3: at step 10 (the final evaluation) seed s's two runs
  differ in exactly 20 % of the images; at step 5 (an earlier one) they differ in about 60 %."""
  path = tmp_path_factory.mktemp('runs')
  rng = np.random.default_rng(3)
  for seed in range(4):
    final_a = moved(LABELS, 0.1, rng)
    early = {d: rng.integers(0, CLASSES, N) for d in ('float32', 'bfloat16')}
    finals = {'float32': final_a, 'bfloat16': moved(final_a, 0.2, rng)}
    for dtype in ('float32', 'bfloat16'):
      plant(
        path / dtype / f's{seed}', seed, dtype, {5: item(early[dtype]), 10: item(finals[dtype])}
      )
  return path


def copy_root(root, tmp_path):
  shutil.copytree(root, tmp_path / 'runs', symlinks=True)
  return tmp_path / 'runs'


def contrast_churn(out):
  table = out.agreement.table
  return table.loc[table['kind'] == 'contrast', 'churn_pct'].iloc[0]


def analysed(path):
  frame, _ = inputs.load(str(path))
  return analyse.study_analysis(frame, read_predictions=inputs.read_predictions)


def test_every_run_uses_the_predictions_of_its_results_step(root):
  out = analysed(root)
  assert contrast_churn(out) == pytest.approx(20.0) and out.agreement.missing == []


def test_a_final_step_without_predictions_leaves_the_run_out_of_these_sections_only(root, tmp_path):
  """Case 1. Before: the run's step-5 predictions (an older model) were compared with the other
  arm's final ones: churn 37.5 % instead of 20 %, no warning."""
  runs = copy_root(root, tmp_path)
  bf16 = runs / 'bfloat16' / 's3'
  shutil.rmtree(record.checkpoint_dir(bf16) / '10' / record.PREDICTIONS_ITEM)
  out = analysed(runs)
  assert contrast_churn(out) == pytest.approx(20.0)  # seeds 0-2, the final models only
  assert out.agreement.missing == [str(bf16)]
  assert out.agreement.summary.endswith(
    '; 1 of 8 runs left out of the agreement, calibration and per-class tables (1 no '
    "predictions at its results' step)."
  )
  assert list(out.arms['n']) == [4, 4]  # the accuracy, the tests and the verdict keep the run
  pred, why = inputs.predictions_at(str(bf16), 10, N)
  assert pred is None and why == (
    "no predictions at its results' step (10; the newest at step 5: an older evaluation)"
  )


def truncate(path):
  """Cut the file at `path` to half its size (a write cut short)."""
  os.truncate(path, os.path.getsize(path) // 2)


def test_a_damaged_predictions_item_excludes_that_run_from_these_sections_only(root, tmp_path):
  """Before: one truncated file inside a predictions item stopped the whole analysis with a raw
  OCDBT/TensorStore error. Now the run is left out of these sections, and the tracebacks
  TensorStore's late callbacks printed afterwards are gone too
  (inputs.quiet_closed_loops)."""
  runs = copy_root(root, tmp_path)
  damaged = runs / 'float32' / 's1'
  truncate(
    os.path.join(
      str(record.checkpoint_dir(damaged)), '10', record.PREDICTIONS_ITEM, 'manifest.ocdbt'
    )
  )
  done = run_module(['analysis.analyse', '--runs', str(runs)])
  assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  page = done.stdout.split('## Setup')[0]
  assert (
    '1 of 8 runs left out of the agreement, calibration and per-class tables (1 '
    'predictions item damaged)'
  ) in page
  out = analysed(runs)
  assert out.agreement.missing == [str(damaged)] and list(out.arms['n']) == [4, 4]
  assert contrast_churn(out) == pytest.approx(20.0)


def test_an_item_of_the_wrong_size_or_shape_is_damaged():
  good = item(LABELS)
  assert inputs.item_problem(good, N) is None
  assert inputs.item_problem(good, N + 1) == f'{N} examples, the test split has {N + 1}'
  short = {**good, 'p_label': good['p_label'][:-1]}
  assert inputs.item_problem(short).startswith('arrays of different lengths')
  assert inputs.item_problem({**good, 'task': 'x'}).startswith("task 'x' is neither")
  missing = {k: v for k, v in good.items() if k != 'predicted'}
  assert inputs.item_problem(missing) == 'no predicted array'


def test_the_summary_counts_each_reason_and_keeps_the_old_line_for_records_without_any():
  table = agreement.agreement_table([], pairs=[])
  assert agreement.summary_line(table, [('r', 'no predictions saved')] * 3, 3).startswith(
    'Agreement: no predictions in any of the 3 runs'
  )
  line = agreement.summary_line(
    table, [('a', 'predictions item damaged (x)'), ('b', 'its results name no step')], 2
  )
  assert line == (
    'Agreement: none of the 2 runs has predictions of the step its results came from '
    '(1 predictions item damaged, 1 its results name no step); churn, calibration '
    'and per-class need them.'
  )
