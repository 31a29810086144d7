"""TPU topologies a program can be compiled for on a host without a TPU, and each chip's figures.

A topology is libtpu's name (`v5e:2x4`, `v4:2x2x1`) or Google Cloud's accelerator type (`v5e-8`:
ACCELERATOR_TYPES); v4 and v5p use libtpu's 'megacore' chip configuration (one device per chip, as
axlearn's `run_aot_compilation.py` builds them). The devices come from
`jax.experimental.topologies.get_topology_desc`: they compile programs and hold no data. CHIPS:
each chip's HBM, HBM bandwidth and bf16 peak, with SOURCES. See docs/tpu.md.
"""

import collections
import contextlib
import importlib
import os
import re
import sys

Chip = collections.namedtuple('Chip', 'device_kind hbm_gib hbm_gb_s bf16_tflop_s megacore')

CHIPS = {
  'v4': Chip('TPU v4', 32, 1200, 275, True),
  'v5e': Chip('TPU v5 lite', 16, 819, 197, False),
  'v5p': Chip('TPU v5', 95, 2765, 459, True),
  'v6e': Chip('TPU v6 lite', 32, 1640, 918, False),
}
SOURCES = {
  'v4': 'https://cloud.google.com/tpu/docs/v4',
  'v5e': 'https://cloud.google.com/tpu/docs/v5e',
  'v5p': 'https://cloud.google.com/tpu/docs/v5p',
  'v6e': 'https://cloud.google.com/tpu/docs/v6e',
}
# Google Cloud accelerator types: (libtpu topology, chips per host). v4-N and v5p-N count
# TensorCores (2 per chip), v5e-N (v5litepod-N) and v6e-N count chips.
ACCELERATOR_TYPES = {
  'v4-8': ('v4:2x2x1', (2, 2, 1)),
  'v4-16': ('v4:2x2x2', (2, 2, 1)),
  'v4-32': ('v4:2x2x4', (2, 2, 1)),
  'v5p-8': ('v5p:2x2x1', (2, 2, 1)),
  'v5p-16': ('v5p:2x2x2', (2, 2, 1)),
  'v5p-32': ('v5p:2x2x4', (2, 2, 1)),
  'v5e-1': ('v5e:1x1', (1, 1, 1)),
  'v5e-4': ('v5e:2x2', (2, 2, 1)),
  'v5e-8': ('v5e:2x4', (2, 4, 1)),
  'v5e-16': ('v5e:4x4', (2, 2, 1)),
  'v6e-1': ('v6e:1x1', (1, 1, 1)),
  'v6e-4': ('v6e:2x2', (2, 2, 1)),
  'v6e-8': ('v6e:2x4', (2, 4, 1)),
  'v6e-16': ('v6e:4x4', (2, 2, 1)),
}
ALIASES = {f'v5litepod-{n}': f'v5e-{n}' for n in (1, 4, 8, 16)}
SHAPE = re.compile(r'^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$')
INSTALL = 'pip install -r requirements-tpu.txt (or make setup-tpu): it adds libtpu, jax[tpu]'


Topology = collections.namedtuple('Topology', 'name version libtpu_name options')


def parse(name):
  """The Topology of `name` (module doc); ValueError (one line naming --topology) otherwise."""
  key = ALIASES.get(name, name)
  if key in ACCELERATOR_TYPES:
    libtpu_name, per_host = ACCELERATOR_TYPES[key]
    version = libtpu_name.split(':')[0]
    return Topology(name, version, libtpu_name, _options(version, per_host))
  found = SHAPE.match(name)
  if not found:
    raise ValueError(
      f'--topology {name}: not a TPU topology; give VERSION:SHAPE with VERSION one '
      f'of {", ".join(CHIPS)} (e.g. v5e:2x4, v4:2x2x1) or an accelerator type '
      f'({", ".join(sorted(ACCELERATOR_TYPES))})'
    )
  version = found.group(1)
  dims = tuple(int(d) for d in found.groups()[1:] if d)
  chips = dims[0] * dims[1] * (dims[2] if len(dims) > 2 else 1)
  per_host = (dims + (1,))[:3] if chips < 4 else None  # libtpu's default hosts hold 2x2x1
  return Topology(name, version, name, _options(version, per_host))


def _options(version, per_host):
  options = {'chip_config_name': 'megacore'} if CHIPS[version].megacore else {}
  if per_host:
    options['chips_per_host_bounds'] = tuple(per_host)
  return options


def libtpu_missing():
  """None if libtpu can be imported, else the one line saying what to install."""
  try:
    importlib.import_module('libtpu')
  except ImportError:
    return f'libtpu is not installed, so no TPU program can be compiled here: {INSTALL}'
  return None


@contextlib.contextmanager
def silenced_stderr():
  """File descriptor 2 sent to /dev/null inside: libtpu starting on a host that is no TPU VM
  writes warnings there (no TPU_ACCELERATOR_TYPE, no TPU_WORKER_HOSTNAMES) that do not stop it
  from compiling."""
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
  """The compile-only devices of `topology` (ValueError: libtpu's one-line reason)."""
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')  # no cloud metadata server to ask
  # libtpu takes a host-wide lock (/tmp/libtpu_lockfile) for the TPU it would drive; compiling for
  # a topology drives none, so preflights (and tests) may run side by side.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies

  try:
    with silenced_stderr():
      return topologies.get_topology_desc(topology.libtpu_name, 'tpu', **topology.options).devices
  except Exception as e:  # libtpu's JaxRuntimeError
    first = (str(e).splitlines() or [type(e).__name__])[0]
    raise ValueError(f'--topology {topology.name}: libtpu refuses it ({first})') from None


def facts(topology, devs):
  """{'chips', 'hosts', 'devices', 'device_kind'} of the compile-only devices `devs`."""
  chips = {tuple(d.coords) for d in devs}  # a chip per coordinate; without megacore, 2 devices
  return {
    'chips': len(chips),
    'hosts': len({d.process_index for d in devs}),
    'devices': len(devs),
    'device_kind': devs[0].device_kind,
    'cores_per_device': getattr(devs[0], 'num_cores', 1),
  }
