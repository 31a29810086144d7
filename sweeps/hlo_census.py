"""What a compiled program's optimized HLO text says about its numerics: every product (dot or
convolution) with its kind, direction, operand types, precision and FLOPs, and the rounding
operations of the emulated formats that survived compilation. How each is read, and what the
census found profile by profile: docs/tpu.md ("What the TPU programs carry, profile by profile").
"""

import collections
import dataclasses
import math
import re

from numerics import emulate, formats, profiles
from numerics import setup as numerics_setup

INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*')
ARRAY_TYPE = re.compile(r'^([a-z]+[0-9]*)\[([0-9,]*)\]')
OPCODE = re.compile(r'\s*([a-z][\w\-]*)\(')
OP_NAME = re.compile(r'op_name="([^"]*)"')
PRECISION = re.compile(r'operand_precision=\{([a-z,]+)\}')
ALGORITHM = re.compile(r'algorithm=([\w]+)')
DIM_LABELS = re.compile(r'dim_labels=([\w]+)_([\w]+)->([\w]+)')
LHS_CONTRACTING = re.compile(r'lhs_contracting_dims=\{([0-9,]*)\}')
PRODUCT_OPS = ('convolution', 'dot')


@dataclasses.dataclass(frozen=True)
class Product:
  """One dot or convolution of a compiled program (docs/tpu.md)."""

  kind: str  # 'conv' or 'dense' (or 'other': a product the model did not write)
  direction: str  # 'forward' or 'backward'
  operands: tuple  # element types, e.g. ('f32', 'f32')
  precision: str  # 'default', 'high', 'highest' (or 'a,b' when the two differ)
  algorithm: str  # '' unless a DotAlgorithmPreset set one
  flops: int

  @property
  def how(self):
    """The precision it carries, or its algorithm where one is set."""
    return self.algorithm or self.precision

  @property
  def arithmetic(self):
    """'f32 x f32 @ highest' (operand types, precision or algorithm): how the product computes."""
    return f'{" x ".join(self.operands)} @ {self.how}'


def _split_type(rest):
  """(type text, text after it) of an instruction's right-hand side."""
  if not rest.startswith('('):
    type_text, _, after = rest.partition(' ')
    return type_text, after
  depth = 0
  for i, c in enumerate(rest):
    depth += {'(': 1, ')': -1}.get(c, 0)
    if depth == 0:
      return rest[: i + 1], rest[i + 1 :]
  return rest, ''


def instructions(text):
  """[(name, type text, opcode, line)] of every instruction of an HLO module's text."""
  out = []
  for line in text.splitlines():
    head = INSTRUCTION.match(line)
    if not head:
      continue
    type_text, after = _split_type(line[head.end() :])
    opcode = OPCODE.match(after)
    if opcode:
      out.append((head.group(1), type_text, opcode.group(1), line))
  return out


def array_type(type_text):
  """(element type, dimensions) of an array type such as 'f32[16,8]{1,0:T(8,128)}'."""
  found = ARRAY_TYPE.match(type_text)
  if not found:
    return None, ()
  dims = tuple(int(d) for d in found.group(2).split(',') if d)
  return found.group(1), dims


def _operand_names(line, opcode):
  inside = line.split(f' {opcode}(', 1)[1].split(')', 1)[0]
  return [name.strip().lstrip('%') for name in inside.split(',')][:2]


def _flops(opcode, line, out_dims, operand_dims):
  """2 x output elements x multiply-adds per output element (docs/tpu.md); 0 if unreadable."""
  if opcode == 'convolution':
    labels = DIM_LABELS.search(line)
    rhs = operand_dims[1]
    if not labels or len(labels.group(2)) != len(rhs):
      return 0
    per_output = math.prod(d for d, label in zip(rhs, labels.group(2), strict=True) if label != 'o')
  else:
    contracting = LHS_CONTRACTING.search(line)
    lhs = operand_dims[0]
    dims = [int(d) for d in contracting.group(1).split(',') if d] if contracting else []
    per_output = math.prod(lhs[d] for d in dims if d < len(lhs))
  return 2 * math.prod(out_dims) * per_output


def _kind_and_direction(line):
  name = OP_NAME.search(line)
  op_name = name.group(1) if name else ''
  primitive = op_name.rsplit('/', 1)[-1]
  kind = {'conv_general_dilated': 'conv', 'dot_general': 'dense'}.get(primitive, 'other')
  return kind, 'backward' if 'transpose(' in op_name else 'forward'


def products(text):
  """[Product] of every dot and convolution in the HLO module `text`."""
  listed = instructions(text)
  types = {name: type_text for name, type_text, _, _ in listed}
  out = []
  for _, type_text, opcode, line in listed:
    if opcode not in PRODUCT_OPS:
      continue
    operands = [array_type(types.get(n, '')) for n in _operand_names(line, opcode)]
    precision = PRECISION.search(line)
    levels = sorted(set(precision.group(1).split(','))) if precision else ['default']
    algorithm = ALGORITHM.search(line)
    kind, direction = _kind_and_direction(line)
    out.append(
      Product(
        kind,
        direction,
        tuple(t or '?' for t, _ in operands),
        ','.join(levels),
        algorithm.group(1) if algorithm else '',
        _flops(opcode, line, array_type(type_text)[1], [d for _, d in operands]),
      )
    )
  return out


def rounding_ops(text):
  """The rounding operations in the HLO module `text` (docs/tpu.md): bitcast-converts of an f32
  operand to u32, and reduce-precision instructions."""
  listed = instructions(text)
  types = {name: type_text for name, type_text, _, _ in listed}
  count = 0
  for _, type_text, opcode, line in listed:
    if opcode == 'reduce-precision':
      count += 1
    elif opcode == 'bitcast-convert' and array_type(type_text)[0] == 'u32':
      (source,) = _operand_names(line, opcode)[:1]
      count += array_type(types.get(source, ''))[0] == 'f32'
  return count


def breakdown(found):
  """'conv forward f32 x f32 @ highest: 20; ...': the products grouped, in a stable order."""
  groups = collections.Counter((p.kind, p.direction, p.arithmetic) for p in found)
  return '; '.join(
    f'{kind} {direction} {how}: {n}' for (kind, direction, how), n in sorted(groups.items())
  )


# MXU passes of one product of f32 operands on a TPU (JAX's documentation of lax.Precision and of
# DotAlgorithmPreset, docs.jax.dev: DEFAULT one bf16 pass, HIGH three, HIGHEST six); bf16
# operands take one pass whatever is asked.
PASSES = {'default': 1, 'high': 3, 'highest': 6}
ALGORITHM_PASSES = re.compile(r'_x(\d+)$')


def passes(product):
  """The MXU passes `product` takes on a TPU (PASSES; an algorithm's _xN suffix; f32_f32_f32: 6)."""
  if all(t == 'bf16' for t in product.operands):
    return 1
  if product.algorithm:
    found = ALGORITHM_PASSES.search(product.algorithm)
    return int(found.group(1)) if found else (6 if 'f32_f32_f32' in product.algorithm else 1)
  return max(PASSES.get(level, 1) for level in product.precision.split(','))


def mean_passes(found):
  """The products' FLOP-weighted mean of `passes` (1.0 without products): how many times the
  MXU computes each product FLOP."""
  total = sum(p.flops for p in found)
  return sum(p.flops * passes(p) for p in found) / total if total else 1.0


def configured(config, kind, platform='tpu'):
  """The precision ('default', 'high', 'highest') or algorithm ('dot_bf16_bf16_f32_x3') the
  resolved `config` asks of its `kind` ('conv', 'dense') products traced for `platform`
  (Product.how). A native product asks for numerics.matmul_precision's level (a
  DotAlgorithmPreset: dots carry its algorithm, convolutions ignore it and keep the default); an
  emulated one for what numerics/emulate.py computes there: the fast form's precision (default, on
  bf16 operands, on a TPU) or the reference's (highest). The operand types are not part of it: at
  the default level the compiler may convert f32 operands to bf16 itself, the same one pass."""
  n = config.numerics
  fmt = profiles.formats(n)[kind]
  if fmt == 'native':
    flag = n.matmul_precision
    if flag in formats.PRESET_PRECISIONS:
      return 'default' if kind == 'conv' else f'dot_{flag.lower()}'
    return numerics_setup.LEGACY_LEVEL[flag]
  if emulate.resolve_impl(n.emulate_impl, platform, fmt) == 'fast':
    return emulate.fast_plan(fmt, platform).precision.name.lower()
  return 'highest'


# The bf16 DotAlgorithmPresets and the precision level that computes the same passes on a TPU
# (JAX's DotAlgorithmPreset documentation): the TPU compiler may print a dot's algorithm as that
# level once it has rewritten the dot as a convolution.
SAME_PASSES = {
  'dot_bf16_bf16_f32': 'default',
  'dot_bf16_bf16_f32_x3': 'high',
  'dot_bf16_bf16_f32_x6': 'highest',
}


def as_configured(found, config, platform='tpu'):
  """How many of `found` carry the precision or algorithm `configured` asks of their kind (an
  algorithm or its SAME_PASSES level)."""
  wanted = {kind: configured(config, kind, platform) for kind in profiles.KINDS}

  def same(how):
    return SAME_PASSES.get(how, how)

  return sum(same(p.how) == same(wanted.get(p.kind)) for p in found)
