"""Emulated product formats against the native ones: bench_step's training step per format and
implementation, images/s and the ratio to the native format's speed.

  python -m benchmarks.bench_emulate                                       # CPU: 64^2, batch 64
  python -m benchmarks.bench_emulate --config configs/celeba.py:gpu --batch 256 --formats bf16,tf32

The config is bench_step's (`--config`, its shorthand flags, `--config.*` overrides). For every
format of `--formats` (default: every emulated format but bf16_noise) the step (bench_step.JaxStep:
the run context's step, every parameter training) is compiled under
  native     the platform's own arithmetic for the format, where it has one: the matmul_precision
             level whose native product format it is (numerics.setup.native_formats), or, for bf16
             where no level gives it (GPU, CPU), compute_dtype=bfloat16 (bf16 activations as well)
  reference  numerics.conv_format and dense_format = FORMAT, emulate_impl=reference (rounded
             operands at HIGHEST)
  fast       the same with emulate_impl=fast (the formats with a fast form,
             numerics/emulate.py FAST_FORMATS)
and every distinct variant times `--steps`-step windows in `--windows` alternating rounds, in one
process, so a busy machine slows all alike. Table: median images/s per variant, emulated / native
and fast / reference ratios, and what emulate_impl=auto picks on this platform. The last line is
`fast_vs_reference=<float>`: the smallest fast / reference ratio over the formats (>= 1: the fast
path is nowhere slower here).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import statistics

from benchmarks import common, step_args
from numerics import formats as format_names

FORMATS = format_names.FORMATS[1:]  # the emulated ones
# The default --formats: those without a PRNG key (the model's layers pass none yet).
DEFAULT_FORMATS = tuple(m for m in FORMATS if m not in format_names.NOISY_FORMATS)


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_emulate', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  parser.add_argument(
    '--formats', default=','.join(DEFAULT_FORMATS), help='comma-separated, of ' + ','.join(FORMATS)
  )
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

from benchmarks import bench_step
from configs import common as config_common
from configs import validation
from numerics import emulate as emulate_lib
from numerics import setup as numerics_setup

NATIVE = (('numerics.conv_format', 'native'), ('numerics.dense_format', 'native'))


def native_overrides(fmt, platform):
  """Config overrides that compute `fmt`'s products natively on `platform`, or None."""
  target = numerics_setup.kind_formats(platform, 'default', {'conv': fmt, 'dense': fmt})['conv']
  for level in ('default', 'high', 'highest'):
    if numerics_setup.native_formats(platform, level) == (target, target):
      return NATIVE + (('numerics.matmul_precision', level),)
  if fmt == 'bf16':
    return NATIVE + (('numerics.compute_dtype', 'bfloat16'),)
  return None


def variants(formats, platform):
  """{format: {'native' | 'reference' | 'fast': overrides}}, None where there is no such variant."""
  out = {}
  for fmt in formats:
    out[fmt] = {
      'native': native_overrides(fmt, platform),
      'reference': emulated_overrides(fmt, 'reference'),
      'fast': emulated_overrides(fmt, 'fast') if fmt in emulate_lib.FAST_FORMATS else None,
    }
  return out


def emulated_overrides(fmt, impl):
  """The overrides that emulate product format `fmt` in convs and dense layers with `impl`."""
  return (
    ('numerics.conv_format', fmt),
    ('numerics.dense_format', fmt),
    ('numerics.emulate_impl', impl),
  )


def variant_config(config, overrides):
  """The resolved config of one variant: `config` (as loaded, not resolved) plus `overrides`."""
  return validation.resolve(
    config_common.apply_overrides(config.copy_and_resolve_references(), overrides)
  )


def measure(config, plan, args, devices):
  """{overrides: [seconds per step per window]} for every distinct variant, rounds alternating."""
  distinct = {o for by_impl in plan.values() for o in by_impl.values() if o is not None}
  steps = {}
  for overrides in sorted(distinct):
    print(f'compiling {dict(overrides)} ...', flush=True)
    steps[overrides] = bench_step.build_step(
      variant_config(config, overrides), devices, num_classes=args.num_classes
    )
  times = common.alternate(
    {o: s.run for o, s in steps.items()}, args.warmup, args.windows, args.steps
  )
  return times, {o: s.compile_s for o, s in steps.items()}


def ratio(a, b):
  return None if a is None or b is None else a / b


def table(plan, times, compile_s, batch, platform):
  """(Markdown table, [fast / reference per format])."""
  ips = {o: batch / statistics.median(t) for o, t in times.items()}

  def get(overrides):
    return None if overrides is None else ips[overrides]

  lines = [
    '| format | native setting | native img/s | reference img/s | fast img/s | reference / '
    'native | fast / native | fast / reference | auto here | compile s (ref / fast) |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  fast_vs_ref = []
  for fmt, v in plan.items():
    native, ref, fast = get(v['native']), get(v['reference']), get(v['fast'])
    setting = (
      ', '.join(f'{k.split(".")[-1]}={val}' for k, val in v['native'][len(NATIVE) :])
      if v['native']
      else 'none on this platform'
    )
    if fast is not None:
      fast_vs_ref.append(fast / ref)
    auto = emulate_lib.resolve_impl('auto', platform, fmt)
    lines.append(
      f'| {fmt} | {setting} | {common.fmt(native, ".1f")} | {ref:.1f} | '
      f'{common.fmt(fast, ".1f")} | {common.fmt(ratio(ref, native), ".3f")} | '
      f'{common.fmt(ratio(fast, native), ".3f")} | {common.fmt(ratio(fast, ref), ".3f")} | '
      f'{auto} | {compile_s[v["reference"]]:.1f} / '
      f'{common.fmt(compile_s.get(v["fast"]), ".1f")} |'
    )
  return '\n'.join(lines), fast_vs_ref


def main(argv=None):
  # each variant resolves its own config
  args, config = step_args.parse(make_parser(), argv, resolve=False)
  formats = [f for f in args.formats.split(',') if f]
  unknown = [f for f in formats if f not in FORMATS]
  if unknown or not formats:
    common.fail(f'--formats: unknown {unknown}; choose from {",".join(FORMATS)}')
  print(common.environment())
  print(common.command_line('bench_emulate', argv))
  devices = bench_step.selected_devices(args)
  platform = devices[0].platform
  plan = variants(formats, platform)
  times, compile_s = measure(config, plan, args, devices)
  text, fast_vs_ref = table(plan, times, compile_s, config.batch_size, platform)
  c = config
  print(
    f'ResNet-18 width {c.model.width:g}, {c.model.stem} stem, {c.data.image_size}^2, global '
    f'batch {c.batch_size} on {len(devices)} {platform} device(s), conv_impl '
    f'{c.numerics.conv_impl}; median of {args.windows} alternating windows x {args.steps} '
    'steps; ratios of images/s'
  )
  print(text)
  print(f'fast_vs_reference={min(fast_vs_ref) if fast_vs_ref else float("nan"):.4f}')


if __name__ == '__main__':
  main()
