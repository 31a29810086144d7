"""The census of sweeps/preflight.py on planted HLO text (the lines as XLA's TPU compiler prints
them): products with their kind, direction, operand types, precision and FLOPs; the rounding
operations; what each profile asks for; the roofline and the largest-batch search of
sweeps/tpu.py."""

import pytest

from configs import common, validation
from sweeps import preflight, tpu

# A forward convolution at highest on bf16-converted input, a backward weight gradient at
# default, a dense product (printed by the TPU compiler as a convolution) and a dot with an
# algorithm, and the rounding of numerics/formats.py: a bitcast of f32 to u32 (counted), a
# bitcast of u32 back to f32 and one of a u32 PRNG value to f32 (not counted), a
# reduce-precision (counted).
# (A backslash at a line's end continues the HLO line: the text is the same as one long line.)
PLANTED = """
HloModule jit__train_step

%fused_computation.1 (param_0.1: f32[16,8,8,1]) -> bf16[16,8,8,1] {
  %param_0.1 = f32[16,8,8,1]{0,3,2,1:T(8,128)} parameter(0)
  ROOT %convert.1 = bf16[16,8,8,1]{0,3,2,1:T(2,128)(2,1)} convert(%param_0.1)
}

ENTRY %main (p0: f32[16,8,8,1], p1: f32[3,3,1,8], p2: f32[16,64], p3: f32[64,10], \
p4: u32[4]) -> (f32[16,8,8,8], f32[3,3,1,8]) {
  %p0 = f32[16,8,8,1]{0,3,2,1:T(8,128)} parameter(0)
  %p1 = f32[3,3,1,8]{3,2,1,0:T(1,128)} parameter(1)
  %p2 = f32[16,64]{1,0:T(8,128)} parameter(2)
  %p3 = f32[64,10]{1,0:T(8,128)} parameter(3)
  %p4 = u32[4]{0} parameter(4)
  %fusion.1 = bf16[16,8,8,1]{0,3,2,1:T(2,128)(2,1)} fusion(%p0), kind=kLoop, \
calls=%fused_computation.1
  %convolution.1 = f32[16,8,8,8]{0,3,2,1:T(8,128)} convolution(%fusion.1, %p1), \
window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, operand_precision={highest,highest}, \
metadata={op_name="jit(_train_step)/jvp()/conv_general_dilated" stack_frame_id=1}
  %convolution.2 = f32[3,3,1,8]{3,2,1,0:T(1,128)} convolution(%p0, %convolution.1), \
window={size=8x8 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf, \
metadata={op_name="jit(_train_step)/transpose(jvp())/conv_general_dilated" stack_frame_id=2}
  %convolution.3 = f32[16,10]{1,0:T(8,128)} convolution(%p2, %p3), dim_labels=bf_io->bf, \
operand_precision={high,high}, \
metadata={op_name="jit(_train_step)/jvp()/dot_general" stack_frame_id=3}
  %dot.4 = f32[16,10]{1,0} dot(%p2, %p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}, \
algorithm=dot_bf16_bf16_f32_x3, metadata={op_name="jit(_train_step)/transpose(jvp())/dot_general"}
  %bitcast-convert.5 = u32[16,8,8,1]{0,3,2,1} bitcast-convert(%p0), \
metadata={op_name="jit(_train_step)/jvp()/bitcast_convert_type"}
  %bitcast-convert.6 = f32[16,8,8,1]{0,3,2,1} bitcast-convert(%bitcast-convert.5)
  %bitcast-convert.7 = f32[4]{0} bitcast-convert(%p4)
  %reduce-precision.8 = f32[16,64]{1,0} reduce-precision(%p2), exponent_bits=8, mantissa_bits=7
  ROOT %tuple.9 = (f32[16,8,8,8]{0,3,2,1:T(8,128)}, f32[3,3,1,8]{3,2,1,0}) tuple(%convolution.1, \
%convolution.2)
}
"""


def test_every_product_with_kind_direction_operands_precision_and_flops():
  found = preflight.products(PLANTED)
  assert [(p.kind, p.direction, p.operands, p.how) for p in found] == [
    ('conv', 'forward', ('bf16', 'f32'), 'highest'),
    ('conv', 'backward', ('f32', 'f32'), 'default'),
    ('dense', 'forward', ('f32', 'f32'), 'high'),
    ('dense', 'backward', ('f32', 'f32'), 'dot_bf16_bf16_f32_x3'),
  ]
  # 2 x outputs x the kernel operand's dimensions but its output features: 3x3x1 per output
  # (forward), 8x8x16 (weight gradient: the cotangent f32[16,8,8,8] as kernel, i = batch), 64
  # (dense, both forms)
  assert [p.flops for p in found] == [
    2 * 16 * 8 * 8 * 8 * 9,
    2 * 3 * 3 * 1 * 8 * 8 * 8 * 16,
    2 * 16 * 10 * 64,
    2 * 16 * 10 * 64,
  ]
  assert preflight.breakdown(found).startswith('conv backward f32 x f32 @ default: 1; ')


def test_rounding_ops_are_f32_to_u32_bitcasts_and_reduce_precisions():
  assert preflight.rounding_ops(PLANTED) == 2


def test_passes_weight_the_products_flops():
  found = preflight.products(PLANTED)
  assert [preflight.passes(p) for p in found] == [6, 1, 3, 3]
  flops = [p.flops for p in found]
  expected = (6 * flops[0] + flops[1] + 3 * flops[2] + 3 * flops[3]) / sum(flops)
  assert preflight.mean_passes(found) == pytest.approx(expected)
  assert preflight.mean_passes([]) == 1.0


def configured(*overrides):
  config = validation.resolve(common.load('configs/digits.py:smoke', list(overrides)))
  return {k: preflight.configured(config, k) for k in ('conv', 'dense')}


@pytest.mark.parametrize(
  'overrides, wanted',
  [
    ((), ('default', 'default')),  # native at the default precision: no attribute
    ((('numerics.matmul_precision', 'highest'),), ('highest', 'highest')),
    ((('numerics.matmul_precision', 'BF16_BF16_F32_X3'),), ('default', 'dot_bf16_bf16_f32_x3')),
    ((('numerics.profile', 'tpu_default'),), ('default', 'default')),  # bf16 operands, 1 pass
    ((('numerics.profile', 'jax_gpu_default'),), ('default', 'default')),  # TF32 as 4 bf16 passes
    ((('numerics.profile', 'torch_gpu_default'),), ('default', 'highest')),
    ((('numerics.profile', 'f32'),), ('highest', 'highest')),
    ((('numerics.profile', 'bf16_noise'),), ('highest', 'highest')),
    (
      (('numerics.profile', 'tpu_default'), ('numerics.emulate_impl', 'reference')),
      ('highest', 'highest'),
    ),  # rounded operands, multiplied exactly
  ],
)
def test_what_each_setting_asks_of_a_tpu(overrides, wanted):
  assert tuple(configured(*overrides).values()) == wanted


def test_as_configured_counts_each_kind_against_its_own_wish():
  config = validation.resolve(
    common.load('configs/digits.py:smoke', [('numerics.matmul_precision', 'BF16_BF16_F32_X3')])
  )
  # conv asks default (1 of 2 conv products), dense the algorithm: the dot carrying it and the
  # convolution carrying `high`, its three passes, both count
  assert preflight.as_configured(preflight.products(PLANTED), config) == 3
  f32 = validation.resolve(common.load('configs/digits.py:smoke', [('numerics.profile', 'f32')]))
  assert preflight.as_configured(preflight.products(PLANTED), f32) == 1


def test_roofline_is_the_slower_of_compute_and_memory():
  chip = tpu.CHIPS['v5e']  # 197 TFLOP/s, 819 GB/s
  assert tpu.roofline_s(197e12, 1.0, 1.0, chip) == pytest.approx(1.0)
  assert tpu.roofline_s(197e12, 1.0, 6.0, chip) == pytest.approx(6.0)
  assert tpu.roofline_s(1.0, 819e9 * 2, 1.0, chip) == pytest.approx(2.0)


@pytest.mark.parametrize(
  'boundary, start', [(1000, 64), (64, 64), (8, 64), (0, 64), (5000, 64), (700, 1024), (12, 8)]
)
def test_largest_batch_search_brackets_then_bisects_on_multiples(boundary, start):
  """Planted: batches up to `boundary` fit; unit 8, limit 1436 (searched up to 1432)."""
  asked = []

  def fits(batch):
    asked.append(batch)
    assert batch % 8 == 0 and 8 <= batch <= 1432, batch
    return batch <= boundary

  largest, calls = tpu.largest_batch(fits, start, 8, 1436, max_compiles=20)
  assert largest == min(boundary, 1432) // 8 * 8
  assert calls == len(asked) <= 12 and len(set(asked)) == len(asked)


def test_largest_batch_search_stops_at_its_compile_budget():
  largest, calls = tpu.largest_batch(lambda b: True, 64, 8, 10**6, max_compiles=3)
  assert (largest, calls) == (256, 3)


def test_topology_names():
  assert tpu.parse_topology('v5e-8').options == {'chips_per_host_bounds': (2, 4, 1)}
  assert tpu.parse_topology('v5e-8').libtpu_name == 'v5e:2x4'
  assert tpu.parse_topology('v5e:2x4').options == {}  # libtpu's own host split: 2 hosts
  assert tpu.parse_topology('v4:2x2x1').options == {'chip_config_name': 'megacore'}
  assert tpu.parse_topology('v5litepod-4').libtpu_name == 'v5e:2x2'
  assert tpu.parse_topology('v6e:1x1').options == {'chips_per_host_bounds': (1, 1, 1)}
  for bad in ('v9:2x2', 'v5e', 'v5e:2x2x2x2', 'tpu'):
    with pytest.raises(ValueError, match='--topology'):
      tpu.parse_topology(bad)
