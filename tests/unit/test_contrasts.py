"""Pre-registered contrasts: the family and its Holm adjustment from a study's declaration, short
arm labels, every pair only on request, and the declaration written into the root before the first
run (a changed one refused once runs exist)."""

import json

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats import multitest

from analysis import analyse, declaration, stats
from runrecord import record
from sweeps import sweep
from tests.support.planted_tables import DIGITS, digits_frame, write_study

METRIC = 'final.test_accuracy'


def test_the_digits_declaration_gives_seven_contrasts_with_holm_over_exactly_them():
  out = analyse.study_analysis(digits_frame(), DIGITS)
  table = out.contrasts
  assert len(table) == 7 and out.pairs.empty  # every pair only with --all-pairs
  assert list(table['label']) == [
    'f32',
    'jax_gpu_default',
    'torch_gpu_default',
    'tpu_default',
    'BN/16',
    'bf16 activations',
    'bf16_noise',
  ]
  info = out.arm_info.set_index('arm')
  assert set(info.loc[table['arm_b'], 'label']) == {'native'}  # Δ = arm − the reference arm
  assert list(table['role']).count('noise') == 1
  for test in ('tost', 'test', 'welch', 'signed_rank'):
    holm = multitest.multipletests(table[f'{test}_p'], method='holm')[1]
    assert table[f'{test}_p_holm'].to_numpy() == pytest.approx(holm), test
  both = analyse.study_analysis(digits_frame(), DIGITS, all_pairs=True)
  assert len(both.pairs) == 28  # all pairs on request, Holm over all 28 apart from the family
  assert both.contrasts['tost_p_holm'].tolist() == pytest.approx(table['tost_p_holm'].tolist())
  assert both.pairs['tost_p_holm'].max() >= table['tost_p_holm'].max()


def test_two_platforms_give_each_platform_its_own_family():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu')), DIGITS)
  table = out.contrasts
  assert len(table) == 14 and list(table['platform']) == ['cpu'] * 7 + ['gpu'] * 7
  info = out.arm_info.set_index('arm')
  assert (
    info.loc[table['arm_a'], 'platform'].to_numpy()
    == info.loc[table['arm_b'], 'platform'].to_numpy()
  ).all()
  holm = multitest.multipletests(table['tost_p'], method='holm')[1]
  assert table['tost_p_holm'].to_numpy() == pytest.approx(holm)
  assert set(out.noise) == {'cpu', 'gpu'} and out.noise['gpu'].half > 0


def test_short_labels_say_only_what_differs_from_the_reference():
  def label(**levels):
    return declaration.arm_label(
      DIGITS, {'profile': 'native', 'batchnorm_group': '0', 'compute_dtype': 'float32', **levels}
    )

  assert label() == 'native'
  assert label(profile='tpu_default') == 'tpu_default'
  assert label(batchnorm_group=16) == 'BN/16' and label(batchnorm_group=16.0) == 'BN/16'
  assert label(compute_dtype='bfloat16') == 'bf16 activations'
  assert label(profile='f32', compute_dtype='bfloat16') == 'f32, bf16 activations'
  assert (
    declaration.arm_label({'factors': ['platform', 'x'], 'reference': {'x': 'a'}}, {'x': 'b'})
    == 'x=b'
  )  # no declared label: factor=level


def test_arms_the_declaration_cannot_tell_apart_are_one_line_error():
  frame = digits_frame().assign(
    **{'numerics.requested.param_dtype': lambda f: np.where(f['seed'] % 2, 'float32', 'bfloat16')}
  )  # an undeclared field splits every arm in two
  with pytest.raises(ValueError, match='have the same declared factor levels') as e:
    analyse.study_analysis(frame, DIGITS)
  assert '\n' not in str(e.value)


def study_config(tmp_path, margin):
  path = tmp_path / 'cfg.py'
  path.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    "def get_sweep(arg=None):\n  return [{'seed': 0}]\n\n"
    f'def get_study(arg=None):\n  return {{**digits.get_study(arg), "margin": {margin}}}\n'
  )
  return f'--config={path}:smoke'


def test_declaration_is_written_before_the_first_run_and_a_changed_one_is_refused(tmp_path, capsys):
  root = tmp_path / 'study'
  emit = f'--emit-study={root / declaration.STUDY_FILE}'  # a dry run writes only what it is asked
  assert sweep.main([study_config(tmp_path, 2.0), f'--root={root}', '--dry-run', emit]) == 0
  saved = json.loads((root / declaration.STUDY_FILE).read_text())
  assert saved['margin'] == 2.0 and saved['reference']['profile'] == 'native'
  assert 'study declaration:' in capsys.readouterr().out
  assert sweep.main([study_config(tmp_path, 1.0), f'--root={root}', '--dry-run', emit]) == 0
  assert json.loads((root / declaration.STUDY_FILE).read_text())['margin'] == 1.0  # no runs yet
  (run,), _, _ = sweep.expand(study_config(tmp_path, 1.0).split('=', 1)[1], str(root))
  record.write_results(
    run.workdir, {'status': 'running', 'seed': 0, 'config': run.config.to_dict()}
  )
  capsys.readouterr()
  assert sweep.main([study_config(tmp_path, 0.5), f'--root={root}', '--dry-run', emit]) == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error:')]
  assert len(errors) == 2 and 'margin: 1.0 -> 0.5' in errors[0] and 'use a new --root' in errors[0]
  assert errors[1] == 'error: 1 problem(s) found before launching: nothing was run or written'
  assert json.loads((root / declaration.STUDY_FILE).read_text())['margin'] == 1.0  # untouched
  assert declaration.from_roots([str(root)])[0]['margin'] == 1.0


def test_roots_that_declare_different_studies_are_refused(tmp_path):
  for name, margin in (('a', 1.0), ('b', 2.0)):
    write_study(tmp_path / name, {**DIGITS, 'margin': margin})
  with pytest.raises(ValueError, match='declare different studies') as e:
    declaration.from_roots([str(tmp_path / 'a'), str(tmp_path / 'b')])
  assert 'margin: 1.0 -> 2.0' in str(e.value)
  assert declaration.from_roots([str(tmp_path / 'a'), str(tmp_path)]) == (
    {**DIGITS, 'margin': 1.0},
    f'{tmp_path}/a/{declaration.STUDY_FILE}',
  )
  assert stats.family(pd.DataFrame(columns=['arm', 'platform', 'role', 'n'])) == []
