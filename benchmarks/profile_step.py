"""Where a training step's device time goes: a profiler trace of bench_step's step, summarised.

  python -m benchmarks.profile_step --config configs/celeba.py:gpu --batch 256 \
      --compute-dtype bfloat16                                                         # GPU
  python -m benchmarks.profile_step --image-size 32 --batch 16 --width 0.25 --steps 2  # CPU

Takes the same arguments as `benchmarks/bench_step.py` (`--config`, its shorthand flags and
`--config.*` overrides, plus `--trace-dir`), builds the same step through the run context, runs
`--warmup` steps, then records `--steps` steps under `jax.profiler.trace` (with a Perfetto JSON
trace) and reads that trace back: every complete event on the device's tracks is a kernel (GPU) or
an XLA operation (CPU/TPU). It prints, per step:

  - device busy time (the union of kernel intervals) against wall time: the gap is launch overhead
    or host work the device waits for;
  - time by category (convolution, matmul, reduction fusion, elementwise fusion, copy/transpose,
    other; a fusion is classified by the HLO it runs, from the compiled step's text) and the top
    kernels by total time.

The last line is `device_busy_fraction=<float>`. The raw trace stays under `--trace-dir` for
Perfetto (ui.perfetto.dev) or TensorBoard's profile plugin.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

from benchmarks import common, step_args


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.profile_step', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  parser.add_argument('--trace-dir', default='', help='where the trace goes (default: a temp dir)')
  parser.add_argument('--top', type=int, default=25, help='kernels listed')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

import jax

from benchmarks import bench_step

# Category of a kernel by (lower-cased) substrings of its name, first match wins: the fallback for
# kernels the compiled HLO does not name (cuDNN: fprop/dgrad/wgrad/implicit_gemm; cuBLAS: gemm).
CATEGORIES = (
  ('convolution', ('conv', 'implicit', 'dgrad', 'wgrad', 'fprop', 'cudnn')),
  ('matmul', ('gemm', 'cutlass', 'dot', 'matmul')),
  ('reduction fusion', ('reduce', 'reduction')),
  ('copy/transpose', ('copy', 'transpose', 'memcpy', 'memset', 'pad', 'concatenate', 'slice')),
  ('elementwise fusion', ('fusion', 'loop_', 'add', 'multiply', 'convert', 'select')),
)


def category(name):
  """Category of a kernel from its name alone (the fallback of `hlo_categories`)."""
  lowered = name.lower()
  for label, keys in CATEGORIES:
    if any(k in lowered for k in keys):
      return label
  return 'other'


# `%name = <type> opcode(...)` lines of HLO text; a computation opens with `%name (...) -> ... {`.
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\b([a-z][a-z0-9\-]*)\(')
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$')
_MOVES = {
  'copy',
  'transpose',
  'concatenate',
  'pad',
  'slice',
  'dynamic-slice',
  'bitcast',
  'dynamic-update-slice',
  'reshape',
  'broadcast',
  'parameter',
  'constant',
  'tuple',
  'get-tuple-element',
  'reverse',
  'iota',
  'copy-start',
  'copy-done',
}
_REDUCTIONS = {'reduce', 'reduce-window', 'select-and-scatter', 'scatter', 'sort'}


def _category_of_ops(ops, text):
  targets = ' '.join(re.findall(r'custom_call_target="([^"]+)"', text)).lower()
  if 'convolution' in ops or 'conv' in targets:
    return 'convolution'
  if 'dot' in ops or 'gemm' in targets or 'matmul' in targets:
    return 'matmul'
  if ops & _REDUCTIONS:
    return 'reduction fusion'
  if ops <= _MOVES:
    return 'copy/transpose'
  return 'elementwise fusion'


def hlo_categories(text):
  """{HLO instruction name: category} from a compiled module's text (`compiled.as_text()`).

  A fusion is classified by what its fused computation holds (a convolution or cuDNN call, a dot
  or cuBLAS call, a reduction, only data movement, else elementwise), so a kernel's category
  does not depend on how the backend names it (XLA:CPU runs dots and reductions alike as
  'ynn_fusion', for example).
  """
  bodies, lines, current = {}, {}, None
  for line in text.splitlines():
    head = _COMPUTATION.match(line)
    if head and not line.startswith(' '):
      current = head.group(1)
      bodies[current] = []
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      bodies[current].append((match.group(1), match.group(2)))
      lines[match.group(1)] = line
  out = {}
  for instructions in bodies.values():
    for name, opcode in instructions:
      line = lines[name]
      ops, text_of = {opcode}, line
      callee = re.search(r'calls=%?([\w.\-]+)', line)
      if callee and callee.group(1) in bodies:
        ops = {op for _, op in bodies[callee.group(1)]}
        text_of = ' '.join(lines[n] for n, _ in bodies[callee.group(1)])
      out[name] = _category_of_ops(ops, text_of)
  return out


def find_trace(trace_dir):
  """The newest perfetto_trace.json.gz under `trace_dir`."""
  paths = sorted(
    glob.glob(os.path.join(trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True),
    key=os.path.getmtime,
  )
  if not paths:
    raise FileNotFoundError(f'no perfetto_trace.json.gz under {trace_dir}')
  return paths[-1]


def load_events(path):
  with gzip.open(path, 'rt') as f:
    data = json.load(f)
  return data['traceEvents'] if isinstance(data, dict) else data


def device_events(events):
  """Complete ('X') events on device tracks: GPU/TPU processes, else the XLA op threads on CPU."""
  names = {
    e['pid']: e.get('args', {}).get('name', '')
    for e in events
    if e.get('ph') == 'M' and e.get('name') == 'process_name'
  }
  devices = {pid for pid, name in names.items() if '/device:' in name and 'cpu' not in name.lower()}
  complete = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
  if devices:
    return [e for e in complete if e['pid'] in devices], 'device'
  # CPU: XLA's thunk executor records each HLO operation it runs (args carry 'hlo_op').
  ops = [e for e in complete if 'hlo_op' in e.get('args', {})]
  return ops, 'host XLA operations (CPU: thread-pool work overlaps, so busy time is a union)'


def busy_time(events):
  """Length of the union of the events' [ts, ts + dur) intervals (microseconds)."""
  total, end = 0.0, None
  for start, stop in sorted((e['ts'], e['ts'] + e['dur']) for e in events):
    if end is None or start > end:
      total += stop - start
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def event_category(event, categories):
  """The event's category: from the HLO instruction it ran (args 'hlo_op'), else its name."""
  op = event.get('args', {}).get('hlo_op', event['name'])
  return categories.get(op) or categories.get(event['name']) or category(event['name'])


def summarize(events, steps, categories=None):
  """Per-step busy/wall time, time by category and by kernel, all in microseconds per step.

  `categories`: hlo_categories of the compiled step (else kernels are classified by name).
  """
  if not events:
    raise ValueError('the trace holds no device events (is a profiler plugin available?)')
  categories = categories or {}
  span = max(e['ts'] + e['dur'] for e in events) - min(e['ts'] for e in events)
  by_category, by_kernel, counts, kinds = (
    collections.Counter(),
    collections.Counter(),
    collections.Counter(),
    {},
  )
  for e in events:
    kinds[e['name']] = event_category(e, categories)
    by_category[kinds[e['name']]] += e['dur'] / steps
    by_kernel[e['name']] += e['dur'] / steps
    counts[e['name']] += 1
  return {
    'busy': busy_time(events) / steps,
    'span': span / steps,
    'kernel_sum': sum(e['dur'] for e in events) / steps,
    'launches': len(events) / steps,
    'by_category': by_category,
    'by_kernel': by_kernel,
    'kinds': kinds,
    'counts': {k: v / steps for k, v in counts.items()},
  }


def step_lines(s, top=25, source='device'):
  lines = [
    f'events from: {source}',
    f'per step: device busy {s["busy"] / 1e3:.3f} ms of {s["span"] / 1e3:.3f} ms span '
    f'({s["busy"] / s["span"]:.1%} busy), {s["launches"]:.0f} kernels, sum of kernel '
    f'times {s["kernel_sum"] / 1e3:.3f} ms',
    '',
    '| category | ms/step | share of kernel time |',
    '|---|---|---|',
  ]
  for name, us in s['by_category'].most_common():
    lines.append(f'| {name} | {us / 1e3:.3f} | {us / s["kernel_sum"]:.1%} |')
  lines += [
    '',
    f'| top {top} kernels | category | calls/step | ms/step | share |',
    '|---|---|---|---|---|',
  ]
  for name, us in s['by_kernel'].most_common(top):
    short = name if len(name) <= 90 else name[:87] + '...'
    lines.append(
      f'| `{short}` | {s["kinds"][name]} | {s["counts"][name]:.0f} | {us / 1e3:.3f} | '
      f'{us / s["kernel_sum"]:.1%} |'
    )
  return '\n'.join(lines)


def main(argv=None):
  args, config = step_args.parse(make_parser(), argv)
  print(common.environment())
  print(common.command_line('profile_step', argv))
  bench = bench_step.build_step(
    config, bench_step.selected_devices(args), num_classes=args.num_classes
  )
  bench.run(args.warmup)
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix='profile_step_')
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    seconds = bench.run(args.steps)
  print(
    f'traced {args.steps} steps: {seconds / args.steps * 1e3:.2f} ms/step wall under the '
    f'profiler; trace in {trace_dir}'
  )
  events, source = device_events(load_events(find_trace(trace_dir)))
  s = summarize(events, args.steps, hlo_categories(bench.step.as_text()))
  print(step_lines(s, args.top, source))
  print(f'device_busy_fraction={s["busy"] / s["span"]:.4f}')


if __name__ == '__main__':
  main()
