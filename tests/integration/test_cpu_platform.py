"""A CPU is not one platform: CPU records name the processor, its instruction set and XLA's, and
two instruction sets are two platforms (runrecord/rules.py platform_identity, numerics/setup.py
cpu_facts)."""

import math
import platform as host

import pytest

from analysis import inputs, stats
from configs import digits
from numerics import setup as numerics_setup
from runrecord import record, rules
from tests.support.planted_runs import make_record
from trainer import process

AVX512_HOST = 'fpu sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni'.split()
AVX2_HOST = 'fpu sse4_1 sse4_2 avx avx2 fma'.split()
SSE_HOST = 'fpu sse4_1 sse4_2'.split()


def cpu_record(seed, accuracy, **cpu):
  """A completed digits smoke run's record on a CPU with facts `cpu` (CPU_FACTS, absent: an old
  record), as the trainer writes it."""
  config = digits.get_config('smoke')
  config.seed = seed
  facts = {'platform': 'cpu', 'device_kind': 'cpu', **cpu, 'num_devices': 1, 'num_processes': 1}
  return make_record(config, accuracy, facts=facts)


def isa(level):
  return {'cpu_model': 'AMD EPYC', 'cpu_isa': level, 'xla_cpu_isa': level}


@pytest.mark.parametrize(
  'flags, xla_flags, expected',
  [
    (AVX512_HOST, '', 'AVX512_VNNI'),  # the best level the host has (no avx512_bf16: not above)
    (AVX2_HOST, '', 'AVX2'),
    (SSE_HOST, '', 'SSE4_2'),
    (['fpu', 'sse2'], '', None),  # below every level XLA names: not recorded
    ([], '', None),  # no /proc/cpuinfo flags: not recorded
    (AVX512_HOST, '--xla_cpu_max_isa=AVX2', 'AVX2'),  # a pin lowers XLA's level
    (AVX512_HOST, '--xla_foo=1 --xla_cpu_max_isa=sse4_2', 'SSE4_2'),  # any case, among others
    (AVX512_HOST, '--xla_cpu_max_isa=AVX --xla_cpu_max_isa=AVX2', 'AVX2'),  # the last one counts
    (AVX2_HOST, '--xla_cpu_max_isa=AVX512', 'AVX2'),  # a pin above the host changes nothing
    (AVX2_HOST, '--xla_cpu_max_isa=BOGUS', 'AVX2'),  # XLA ignores an unknown value (a warning)
  ],
)
def test_xla_cpu_isa_is_the_hosts_best_level_under_a_pin(flags, xla_flags, expected):
  assert numerics_setup.xla_cpu_isa(flags, xla_flags) == expected


def test_cpuinfo_reads_the_first_processor_and_nothing_where_absent(tmp_path):
  path = tmp_path / 'cpuinfo'
  path.write_text(
    'processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2\n\n'
    'processor\t: 1\nmodel name\t: other\n'
  )
  assert numerics_setup.cpuinfo(str(path)) == {
    'processor': '0',
    'model name': 'AMD EPYC 9B14',
    'flags': 'fpu avx2',
  }
  assert numerics_setup.cpuinfo(str(tmp_path / 'absent')) == {}


def test_a_cpu_record_names_model_isa_and_xla_flags(monkeypatch, tmp_path):
  """process.execution_facts() on a planted AVX-512 processor with XLA pinned to AVX2 (XLA_FLAGS):
  the record and its row hold the model, both instruction sets and the flags; its platform is a
  third one."""
  monkeypatch.setattr(
    numerics_setup,
    'cpuinfo',
    lambda: {'model name': 'Planted Xeon', 'flags': ' '.join(AVX512_HOST)},
  )
  monkeypatch.setattr(host, 'machine', lambda: 'x86_64')
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_max_isa=AVX2')
  facts = process.execution_facts()
  assert {k: facts[k] for k in record.CPU_FACTS} == {
    'cpu_model': 'Planted Xeon',
    'cpu_isa': 'AVX512_VNNI',
    'xla_cpu_isa': 'AVX2',
  }
  config = digits.get_config('smoke')
  out = record.new_record(config, facts, numerics_setup.describe(config), {}, {}, {})
  record.write_results(str(tmp_path / 'r'), out)
  row = inputs.load_runs(str(tmp_path)).iloc[0]
  assert (row['cpu_model'], row['cpu_isa'], row['xla_cpu_isa']) == (
    'Planted Xeon',
    'AVX512_VNNI',
    'AVX2',
  )
  assert row[record.XLA_FLAGS_COLUMN] == '--xla_cpu_max_isa=AVX2'
  assert row['platform'] == 'cpu-AVX512_VNNI-max-AVX2' and row['device_kind'] == 'cpu'


def test_off_x86_the_architecture_is_the_instruction_set(monkeypatch):
  monkeypatch.setattr(numerics_setup, 'cpuinfo', dict)
  monkeypatch.setattr(host, 'machine', lambda: 'aarch64')
  monkeypatch.setattr(host, 'processor', lambda: '')
  assert numerics_setup.cpu_facts('--xla_cpu_max_isa=AVX2') == (None, 'aarch64', 'aarch64')


def test_runs_on_two_cpu_instruction_sets_are_two_platforms_never_pooled(tmp_path):
  """The same config and seeds on an AVX-512 and on an AVX2 host: two platforms, two arms of 3
  seeds each, no replicates (they once read as one 'cpu' arm whose seeds repeated with different
  values); GPU rows keep their device kind as their platform's."""
  for seed in range(3):
    for level, shift in (('AVX512', 0.0), ('AVX2', 0.01)):
      record.write_results(
        str(tmp_path / level / f'seed{seed}'),
        cpu_record(seed, 0.9 + 0.01 * seed + shift, **isa(level)),
      )
  runs = inputs.load_runs(str(tmp_path))
  assert sorted(set(runs['platform'])) == ['cpu-AVX2', 'cpu-AVX512']
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert sorted(out.arms['arm']) == ['cpu-AVX2', 'cpu-AVX512']
  assert list(out.arms['n']) == [3, 3] and out.replicates.empty
  pair = out.pairs.iloc[0]
  assert pair['paired'] and pair['diff'] == pytest.approx(
    1.0 if pair['arm_a'] == 'cpu-AVX2' else -1.0
  )


@pytest.mark.parametrize(
  'facts, identity',
  [
    ({'platform': 'cpu', **isa('AVX2')}, 'cpu-AVX2'),
    (
      {'platform': 'cpu', 'cpu_isa': 'AVX512_BF16', 'xla_cpu_isa': 'AVX2'},
      'cpu-AVX512_BF16-max-AVX2',
    ),
    ({'platform': 'cpu', 'cpu_isa': 'aarch64', 'xla_cpu_isa': 'aarch64'}, 'cpu-aarch64'),
    ({'platform': 'cpu'}, 'cpu'),  # an old record: not recorded
    ({'platform': 'gpu', 'device_kind': 'NVIDIA H100', **dict.fromkeys(record.CPU_FACTS)}, 'gpu'),
  ],
)
def test_platform_identity_and_back_to_the_jax_platform(facts, identity):
  assert rules.platform_identity(facts) == identity
  assert rules.jax_platform(identity) == facts['platform']


def test_a_record_without_cpu_facts_reads_not_recorded_and_joins_no_known_isa(tmp_path):
  """A CPU record written before the CPU facts existed (the shipped digits records): platform
  'cpu' and the facts missing, never guessed; it is not pooled with a run whose ISA is known."""
  for seed in range(2):
    record.write_results(str(tmp_path / 'old' / f'seed{seed}'), cpu_record(seed, 0.9 + 0.01 * seed))
    record.write_results(
      str(tmp_path / 'new' / f'seed{seed}'), cpu_record(seed, 0.91 + 0.02 * seed, **isa('AVX512'))
    )
  runs = inputs.load_runs(str(tmp_path)).set_index('run')
  old = runs.loc[str(tmp_path / 'old' / 'seed0')]
  assert old['platform'] == 'cpu'
  assert all(old[k] is None or math.isnan(old[k]) for k in record.CPU_FACTS)
  out = stats.arms_and_pairs(runs.reset_index(), margin=0.5)
  assert sorted(out.arms['arm']) == ['cpu', 'cpu-AVX512'] and out.replicates.empty
