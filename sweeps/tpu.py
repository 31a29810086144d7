"""TPU topologies, each chip's figures, a compiled program's roofline estimate, and one run per chip
(`python -m sweeps.tpu --chips=0,1 -- python train.py ...`); the standard library only at import."""

import argparse
import collections
import contextlib
import fcntl
import importlib
import math
import os
import re
import shutil
import sys
import time

ChipSpec = collections.namedtuple('ChipSpec', 'device_kind hbm_gib hbm_gb_s bf16_tflop_s megacore')
CHIPS = {  # Google Cloud's TPU system architecture pages, https://cloud.google.com/tpu/docs/<v>
  'v4': ChipSpec('TPU v4', 32, 1200, 275, True),
  'v5e': ChipSpec('TPU v5 lite', 16, 819, 197, False),
  'v5p': ChipSpec('TPU v5', 95, 2765, 459, True),
  'v6e': ChipSpec('TPU v6 lite', 32, 1640, 918, False),
}
# Chips per host of a TPU VM as Google Cloud sells it, and the host's shape: the "System
# architecture" section of https://cloud.google.com/tpu/docs/<version> (docs/tpu.md).
HOSTS = {'v4': (4, (2, 2, 1)), 'v5p': (4, (2, 2, 1)), 'v5e': (8, (2, 4, 1)), 'v6e': (8, (2, 4, 1))}
# Accelerator types -> libtpu topology. v4-N and v5p-N count TensorCores (2 per chip), v5e-N
# (v5litepod-N) and v6e-N count chips.
GRIDS = {1: '1x1', 4: '2x2', 8: '2x4', 16: '4x4'}  # of v5e-N and v6e-N
ACCELERATOR_TYPES = {f'{v}-{n}': f'{v}:2x2x{n // 8}' for v in ('v4', 'v5p') for n in (8, 16, 32)}
ACCELERATOR_TYPES.update({f'{v}-{n}': f'{v}:{s}' for v in ('v5e', 'v6e') for n, s in GRIDS.items()})
ALIASES = {f'v5litepod-{n}': f'v5e-{n}' for n in GRIDS}
SHAPE = re.compile(r'^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$')

Topology = collections.namedtuple('Topology', 'name version libtpu_name options')


def parse_topology(name):
  """The Topology of an accelerator type (v5e-8: on Google's hosts, HOSTS) or of libtpu's name
  (v5e:2x4: on libtpu's default 2x2x1 hosts); v4 and v5p as 'megacore' chips, a device each."""
  libtpu_name = ACCELERATOR_TYPES.get(ALIASES.get(name, name))
  found = SHAPE.match(libtpu_name or name)
  if not found:
    raise ValueError(
      f'--topology {name}: not a TPU topology; give VERSION:SHAPE with VERSION one '
      f'of {", ".join(CHIPS)} (e.g. v5e:2x4, v4:2x2x1) or an accelerator type '
      f'({", ".join(sorted(ACCELERATOR_TYPES))})'
    )
  version = found.group(1)
  dims = (tuple(int(d) for d in found.groups()[1:] if d) + (1,))[:3]
  per_host = dims if math.prod(dims) < 4 else None  # libtpu's default hosts hold 2x2x1
  if libtpu_name:
    per_host = dims if math.prod(dims) <= HOSTS[version][0] else HOSTS[version][1]
  options = {'chip_config_name': 'megacore'} if CHIPS[version].megacore else {}
  if per_host:
    options['chips_per_host_bounds'] = per_host
  return Topology(name, version, libtpu_name or name, options)


@contextlib.contextmanager
def silenced_stderr():
  """File descriptor 2 to /dev/null: libtpu off a TPU VM warns there, and compiles all the same."""
  sys.stderr.flush()
  saved = os.dup(2)
  with open(os.devnull, 'w') as null:
    os.dup2(null.fileno(), 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def devices(topology):
  """The compile-only devices of `topology`; libtpu missing or refusing it: one-line ValueError."""
  try:
    importlib.import_module('libtpu')
  except ImportError as e:
    raise ValueError(
      'libtpu is not installed: no TPU program can be compiled here; pip install -r '
      'requirements-tpu.txt (or make setup-tpu): it adds libtpu, jax[tpu]'
    ) from e
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')  # no cloud metadata server to ask
  # libtpu's host-wide lock (/tmp/libtpu_lockfile) guards a TPU; compiling drives none.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies

  try:
    with silenced_stderr():
      return topologies.get_topology_desc(topology.libtpu_name, 'tpu', **topology.options).devices
  except Exception as e:  # libtpu's JaxRuntimeError: a topology it refuses is bad input
    first = (str(e).splitlines() or [type(e).__name__])[0]
    raise ValueError(f'--topology {topology.name}: libtpu refuses it ({first})') from e


def facts(devs):  # {'chips', 'hosts', 'devices', 'device_kind'} of compile-only devices
  return {
    'chips': len({tuple(d.coords) for d in devs}),  # a chip per coordinate
    'hosts': len({d.process_index for d in devs}),
    'devices': len(devs),
    'device_kind': devs[0].device_kind,
  }


# --- the roofline estimate of a compiled program: an optimistic bound, not a measurement ---
def roofline_s(flops, bytes_accessed, passes, chip):
  """max(FLOPs x MXU passes / bf16 peak, bytes accessed / HBM bandwidth), per chip."""
  return max(flops * passes / (chip.bf16_tflop_s * 1e12), bytes_accessed / (chip.hbm_gb_s * 1e9))


# What a run spends besides the roofline (docs/tpu.md "Hours a run takes"): a stated disk rate
# for checkpoint writes (assumed, not measured on a TPU VM) and the host feed's gather rate,
# measured here (one thread, 256 random 224x224x3 images at a time from a uint8 memmap: 1.5-1.7
# GB/s on this 2-core host under load 7).
DISK_MB_S, FEED_GB_S = 200, 1.5
TERMS = {
  'startup': 'measured here: this process until its first compile (imports, config, libtpu)',
  'compilation': "measured here: this preflight's compile of each program, assumed the same there",
  'steps': "compiled: the training steps' roofline",
  'evaluation': "compiled: the evaluations' roofline (evaluations x batches x eval step)",
  'checkpoints': f'assumed: the state bytes x checkpoints at {DISK_MB_S} MB/s',
  'feed': f'measured here: a host gathers {FEED_GB_S} GB/s; what steps wait beyond the roofline',
}


def run_terms(ctx, step_s, compile_s, startup_s, hosts):
  """{TERMS name: seconds} of a run from {program: roofline step s, compile s}; None if partial."""
  import jax

  from input_pipeline import batching
  from trainer import run, train

  if any(step_s.get(p.name) is None for p in ctx.phases) or step_s.get('eval') is None:
    return None
  due = [run.due(ctx, s) for s in range(1, ctx.total_steps + 1)]
  batches = batching.num_eval_batches(len(ctx.dataset.test), run.eval_batch(ctx))
  state = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(train.abstract_state(ctx)))
  feed_s = ctx.config.batch_size / hosts * ctx.dataset.train.images[0].nbytes / FEED_GB_S / 1e9
  steps = [(p.stop - p.start, step_s[p.name]) for p in ctx.phases]
  return {
    'startup': startup_s,
    'compilation': sum(compile_s.values()),
    'steps': sum(n * s for n, s in steps),
    'evaluation': sum(d.evaluate for d in due) * batches * step_s['eval'],
    'checkpoints': sum(d.save for d in due) * state / (DISK_MB_S * 1e6),
    'feed': sum(n * max(feed_s - s, 0.0) for n, s in steps),
  }


def readable(seconds):
  """'11.2 ms', '3.4 s', '2m05s', '1h02m05s'."""
  if seconds < 60:
    return f'{seconds * 1e3:.3g} ms' if seconds < 1 else f'{seconds:.3g} s'
  h, rest = divmod(round(seconds), 3600)
  return (f'{h}h{rest // 60:02d}m' if h else f'{rest // 60}m') + f'{rest % 60:02d}s'


def largest_batch(fits, start, unit, limit, max_compiles=8):
  """(largest multiple of `unit` <= `limit` that `fits`, calls): doubling from `start` (halving
  where it does not fit), then bisection, at most `max_compiles` calls; 0 when none fits."""
  calls = [0]

  def check(batch):
    calls[0] += 1
    return fits(batch)

  limit = max(unit, limit // unit * unit)
  start = max(unit, min(limit, start) // unit * unit)
  if check(start):
    good, bad = start, None
    while bad is None and good < limit and calls[0] < max_compiles:
      candidate = min(limit, good * 2)
      good, bad = (candidate, None) if check(candidate) else (good, candidate)
  else:
    good, bad = 0, start
    while good == 0 and bad > unit and calls[0] < max_compiles:
      candidate = max(unit, bad // 2 // unit * unit)
      good, bad = (candidate, bad) if check(candidate) else (0, candidate)
  while bad is not None and bad - good > unit and calls[0] < max_compiles:
    middle = (good + bad) // 2 // unit * unit
    good, bad = (middle, bad) if check(middle) else (good, middle)
  return good, calls[0]


# --- one run per chip of a TPU VM (sweeps.sweep --tpu-chips) ---
# Process ports from 8483, past jax.distributed's Cloud TPU coordinator port (8482,
# jax/_src/clusters/cloud_tpu_cluster.py) and libtpu's default process port 8476; runtime metrics
# ports from libtpu's default 8431 (TPU_RUNTIME_METRICS_PORTS): 8 chips end below both.
PORT_BASE, METRICS_PORT_BASE = 8483, 8431
LOCK_DIR = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'tpu_chips')


class Chip(collections.namedtuple('Chip', 'index')):
  """A slot's TPU chip (sweeps/runner.py hands these out as it hands out GPU ids)."""

  def __str__(self):
    return f'TPU chip {self.index}'


def host_chips():
  """(chips on this host, how known): its PCI bus, TPU_ACCELERATOR_TYPE's host, or HOSTS' max."""
  with contextlib.suppress(ImportError, OSError):
    from jax._src import hardware_utils

    found, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    if found:
      return found, 'the TPU chips on its PCI bus'
  kind = os.environ.get('TPU_ACCELERATOR_TYPE', '').split('-')[0].replace('v5litepod', 'v5e')
  if kind in HOSTS:
    return HOSTS[kind][0], f'a {kind} host (TPU_ACCELERATOR_TYPE)'
  return max(n for n, _ in HOSTS.values()), 'the largest TPU VM host (no TPU found here)'


def parse_chips(text, flag='--tpu-chips'):
  """[Chip] of '0,1,2,3' (None: none); a bad list or an id past this host's: one-line ValueError."""
  if text is None:
    return []
  try:
    ids = [int(c) for c in text.split(',') if c.strip()]
  except ValueError:
    ids = None
  if not ids:
    raise ValueError(f'{flag}={text!r}: give comma-separated chip ids, e.g. {flag}=0,1,2,3')
  count, how = host_chips()
  if any(i < 0 or i >= count for i in ids) or len(set(ids)) != len(ids):
    raise ValueError(
      f'{flag}={text}: give each chip id once, from 0 to {count - 1} ({count} chips: {how}); '
      'two runs cannot share a TPU chip'
    )
  return [Chip(i) for i in ids]


def environment(index):
  """libtpu's per-process variables (a TPU VM runtime's) of a run on chip `index`, its own ports."""
  port = PORT_BASE + index
  return {
    'TPU_VISIBLE_CHIPS': str(index),
    'TPU_PROCESS_BOUNDS': '1,1,1',
    'TPU_CHIPS_PER_PROCESS_BOUNDS': '1,1,1',
    'TPU_PROCESS_PORT': str(port),
    'TPU_PROCESS_ADDRESSES': f'localhost:{port}',
    'TPU_RUNTIME_METRICS_PORTS': str(METRICS_PORT_BASE + index),
    'CLOUD_TPU_TASK_ID': '0',
  }


VARIABLES = tuple(environment(0))


def settings(env):  # 'NAME=value ...' of the VARIABLES set in `env`: a run's train.log header
  return ' '.join(f'{name}={env[name]}' for name in VARIABLES if name in env)


def launcher(chips):  # the argv prefix that starts a command on the first free one of `chips`
  return ['python', '-m', 'sweeps.tpu', f'--chips={",".join(str(c.index) for c in chips)}', '--']


def claim(chips):
  """(chip index, open lock descriptor) of the first of `chips` no other process flocks (polled)."""
  try:
    os.makedirs(LOCK_DIR, exist_ok=True)
  except OSError as e:
    fail(f'{LOCK_DIR}: cannot hold the chip locks there ({e.strerror}); move it or set TMPDIR')
  while True:
    for chip in chips:
      path = os.path.join(LOCK_DIR, f'chip{chip.index}')
      try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
      except OSError as e:
        fail(f'{path}: cannot open the chip lock ({e.strerror}); move it or set TMPDIR')
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return chip.index, fd
      except BlockingIOError:
        os.close(fd)
    time.sleep(1)


def fail(message):
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv=None):
  """`python -m sweeps.tpu --chips=0,1,... -- COMMAND...`: COMMAND on the first free chip."""
  p = argparse.ArgumentParser(
    prog='python -m sweeps.tpu',
    description="Run a command on the first free TPU chip of --chips with libtpu's per-process "
    'variables (the lines sweeps.sweep --tpu-chips emits).',
  )
  p.add_argument('--chips', required=True, help='comma-separated chip ids, e.g. 0,1,2,3')
  p.add_argument('command', nargs=argparse.REMAINDER, help='the command, after --')
  p.error = lambda message: fail(f'{message}; see --help')
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    fail('give the command after --, e.g. -- python train.py --config=...; see --help')
  try:
    chips = parse_chips(args.chips, '--chips')
  except ValueError as e:
    fail(e)
  if command[0] == 'python':  # the command list's `python`: this interpreter
    command = [sys.executable, *command[1:]]
  if not shutil.which(command[0]):
    fail(f'{command[0]}: no such command; give the command after --, e.g. -- python train.py')
  index, fd = claim(chips)
  os.set_inheritable(fd, True)  # the command holds the chip's lock until it exits
  os.environ.update(environment(index))
  print(f'tpu_chips: {settings(os.environ)}', flush=True)
  os.execvp(command[0], command)


if __name__ == '__main__':
  main()
