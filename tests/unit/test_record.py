"""runrecord/record.py: the one owner of the results record, its arm fields and the same-run
rule."""

import json
import subprocess

import pandas as pd
import pytest

from analysis import inputs, stats
from configs import common, validation
from runrecord import record, rules
from tests.support.planted_runs import make_record, smoke

REPO = __file__.rsplit('/tests/', 1)[0]


def other_value(value):
  """A value of the same type as `value` that differs from it (for a numerics field)."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1
  return f'{value}_other'


def test_runs_differing_only_in_conv_impl_form_two_arms(tmp_path):
  """3 seeds under conv_impl=xla and 3 under im2col: two arms of 3, paired by seed, no run
  dropped as a duplicate (they once came out as one arm with 3 'duplicates')."""
  for seed in range(3):
    for impl, shift in (('xla', 0.0), ('im2col', 0.001)):
      record.write_results(
        str(tmp_path / impl / f'seed{seed}'),
        make_record(smoke(seed, conv_impl=impl), 0.9 + 0.01 * seed + shift),
      )
  out = stats.arms_and_pairs(inputs.load_runs(str(tmp_path)), margin=0.5)
  assert sorted(out.arms['arm']) == ['conv_impl=im2col', 'conv_impl=xla']
  assert list(out.arms['n']) == [3, 3] and list(out.arms['n_runs']) == [3, 3]
  assert out.replicates.empty and out.excluded.empty
  pair = out.pairs.iloc[0]
  assert pair['paired'] and pair['n_pairs'] == 3
  assert pair['diff'] == pytest.approx(0.1 if pair['arm_a'] == 'conv_impl=im2col' else -0.1)


@pytest.mark.parametrize('field', sorted(common.base_config().numerics.keys()))
def test_every_numerics_field_a_config_can_set_defines_an_arm(field):
  """Any numerics field, today's or added later, splits runs into arms without being listed."""
  default = common.base_config().numerics[field]
  rows = []
  for seed in range(2):
    for value in (default, other_value(default)):
      config = smoke(seed)
      config.numerics[field] = value
      rows.append(rules.row(f'/r/{value}/{seed}', make_record(config, 0.9 + 0.01 * seed)))
  frame = pd.DataFrame(rows)
  assert f'{record.ARM_PREFIX}{field}' in rules.arm_columns(frame)
  out = stats.arms_and_pairs(frame, margin=0.5)
  assert len(out.arms) == 2 and list(out.arms['n']) == [2, 2]


def test_a_record_written_before_newer_fields_loads_and_joins_its_arm(tmp_path):
  """A record without `schema` and without the numerics fields added since (conv_impl,
  xla_flags, emulate_impl) loads, counts those as their defaults, and pairs with today's runs of
  the same arithmetic; its config is still 'the same run' for resume and the sweep."""
  today = smoke(0)
  old = make_record(today, 0.90)
  old.pop('schema')
  for name in ('conv_impl', 'xla_flags', 'emulate_impl'):
    old['numerics']['requested'].pop(name)
    old['config']['numerics'].pop(name)
  record.write_results(str(tmp_path / 'old' / 'seed0'), old)
  record.write_results(str(tmp_path / 'new' / 'seed1'), make_record(smoke(1), 0.91))
  runs = inputs.load_runs(str(tmp_path))
  assert list(runs['status']) == ['completed', 'completed']
  assert list(runs[f'{record.ARM_PREFIX}conv_impl']) == ['auto', 'auto']
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert len(out.arms) == 1 and out.arms['n'].iloc[0] == 2
  assert rules.config_differences(old['config'], today.to_dict()) == []
  changed = smoke(0, conv_impl='im2col')
  assert rules.config_differences(old['config'], changed.to_dict()) == [
    "numerics.conv_impl: 'auto' -> 'im2col'"
  ]


def test_a_record_written_with_the_removed_emulate_field_maps_to_the_formats(tmp_path):
  """Records written while `numerics.emulate` existed read as today's fields: emulate='none' is
  dropped, another value becomes the conv/dense formats it set (where the record has none), so
  the run joins today's arm of that arithmetic and its config is still 'the same run'."""
  today = validation.resolve(smoke(0, conv_format='bf16', dense_format='bf16'))
  old = make_record(today, 0.90)
  for part in (old['numerics']['requested'], old['config']['numerics']):
    part.update(emulate='bf16', conv_format='', dense_format='')
  record.write_results(str(tmp_path / 'old' / 'seed0'), old)
  record.write_results(
    str(tmp_path / 'new' / 'seed1'),
    make_record(validation.resolve(smoke(1, conv_format='bf16', dense_format='bf16')), 0.91),
  )
  runs = inputs.load_runs(str(tmp_path))
  assert not [c for c in runs.columns if c.endswith('.emulate')]
  assert list(runs[f'{record.ARM_PREFIX}conv_format']) == ['bf16', 'bf16']
  assert len(stats.arms_and_pairs(runs, margin=0.5).arms) == 1
  assert rules.config_differences(old['config'], today.to_dict()) == []
  native = validation.resolve(smoke(0)).to_dict()
  as_written = json.loads(json.dumps(native))
  as_written['numerics']['emulate'] = 'none'  # what every record of the digits study holds
  assert rules.config_differences(as_written, native) == []


def test_same_run_rule_ignores_paths_and_cadence_but_not_arithmetic():
  saved = smoke(0).to_dict()
  moved = smoke(0)
  moved.data.manual_dir, moved.data.cache_dir, moved.log_every_steps = '/elsewhere', '/c', 7
  assert rules.config_differences(saved, moved.to_dict()) == []

  def resolved(config):
    return validation.resolve(config).to_dict()

  assert rules.config_differences(resolved(smoke(0)), resolved(smoke(0, conv_format='bf16'))) == [
    "numerics.conv_format: 'native' -> 'bf16'"
  ]
  assert rules.config_differences(saved, smoke(1).to_dict()) == ['seed: 0 -> 1']


def test_layout_and_arm_fields_are_defined_once():
  """The checkpoint items, their Orbax argument types and the arm prefix are spelled only in
  runrecord/record.py (tests aside)."""

  def places(pattern):
    out = subprocess.run(
      ['git', 'grep', '-n', '-E', pattern, '--', '*.py', ':!tests/'],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
    ).stdout
    return sorted({line.split(':', 1)[0] for line in out.splitlines()})

  assert places(r'ocp\.args\.(Json|Standard)(Save|Restore)') == ['runrecord/record.py']
  assert places(r"'numerics\.requested\.'") == ['runrecord/record.py']
  assert places(r"= 'checkpoints'|\('checkpoints'") == ['runrecord/record.py']
