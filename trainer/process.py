"""What a training process is: signals and the graceful stop, the platforms it can start, GPU
memory, jax.distributed, where it executes, quiet libraries. Standard library only at import."""

import collections
import importlib.metadata
import importlib.util
import logging as std_logging
import os
import pkgutil
import signal
import sys
import threading
import traceback

from absl import logging

# The stop signals: SIGHUP (SSH gone) and SIGUSR1 (SLURM's warning) besides SIGTERM and SIGINT.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# Steps the host may dispatch ahead of the device: 2 keeps the next step queued while one runs (no
# idle device between steps: bench_stop_latency.py measures the images/s at 1, 2 and unbounded).
STEPS_IN_FLIGHT = 2
KNOWN_PLATFORMS = ('cpu', 'gpu', 'cuda', 'rocm', 'tpu')
NVIDIA_DRIVER = ('/proc/driver/nvidia/version', '/dev/nvidiactl')
# The environment variables JAX's GPU backend reads when it starts (JAX's "GPU memory allocation").
MEMORY_VARIABLES = tuple(
  f'XLA_PYTHON_CLIENT_{x}' for x in ('PREALLOCATE', 'MEM_FRACTION', 'ALLOCATOR')
)
JAX_DEFAULT = "JAX's default (a GPU preallocates 75 %)"
VERSIONED_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy')  # recorded


class InFlight:
  """The host's bound on steps dispatched but not done: `dispatched(marker)` after each step waits
  for the step `limit` back (None: no bound)."""

  def __init__(self, limit):
    self.limit = limit
    self._markers = collections.deque()

  def dispatched(self, marker):
    if self.limit is None:
      return
    self._markers.append(marker)
    while len(self._markers) > self.limit:
      self._markers.popleft().block_until_ready()


class Stopped(Exception):
  """Training stopped on a signal after `step`, whose checkpoint is saved and verified."""

  def __init__(self, signum, step):
    self.signum, self.step, self.exit_code = signum, step, 128 + signum
    name = signal.Signals(signum).name
    super().__init__(f'{name} received: stopped after step {step}, whose checkpoint is saved')


# Where a signal stands: 'off' (not ours), 'at_once' (exit now: nothing of this session to save;
# `why` says what stands) or 'graceful' (a StopRequests loop saves its step first).
_STATE = {'mode': 'off', 'why': 'outside the training loop; the newest finished checkpoint stands'}
_EXITING = threading.Lock()


def _exit_now(signum, why):
  """`stopped: why` on stderr, exit 128 + signum now; once (the watch thread, a handler race)."""
  if _EXITING.acquire(blocking=False):
    os.write(2, f'stopped: {why}; run the same command again to resume\n'.encode())
    os._exit(128 + signum)


def exit_at_once(signum, frame):
  """The signal handler outside the training loop's steps."""
  _exit_now(signum, f'{signal.Signals(signum).name} received {_STATE["why"]}')


def exit_on_second(signum, frame):
  """The handler after the first signal in the loop."""
  why = f'a second signal ({signal.Signals(signum).name}) ended the run at once, without saving '
  _exit_now(signum, why + 'this step; the newest finished checkpoint stays valid')


def _watch(fd):
  """Reads the signals Python's C handler writes to the wakeup fd, at once even while the main
  thread sits in a compile (Python handlers wait for it): exits where the mode says at once."""
  while data := os.read(fd, 64):
    for signum in data:
      if signum in SIGNALS and _STATE['mode'] == 'at_once':
        exit_at_once(signum, None)


def install(handler):
  """`handler` for SIGNALS (those not ignored), the watch thread started once (main thread only);
  {signal: previous handler}."""
  previous = {
    sig: signal.signal(sig, handler) for sig in SIGNALS if signal.getsignal(sig) != signal.SIG_IGN
  }
  if not _STATE.get('watching'):
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read,), daemon=True, name='signal-watch').start()
    _STATE['watching'] = True
  _STATE['mode'] = 'at_once'
  return previous


class StopRequests:
  """While entered, a signal before `started()` (this session's first step) exits at once, the
  newest checkpoint standing; after it, it marks a stop the loop makes at a step boundary."""

  def __init__(self, saved_step=None):
    self.signum, self._previous, self._processes, self._outside = None, {}, 1, {}
    stands = f'checkpoint (step {saved_step})' if saved_step else 'checkpoint (none yet)'
    self._why = f"before this session's first step: exited at once; the newest {stands} stands"

  def _mark(self, signum, frame):
    if _STATE['mode'] != 'graceful':
      exit_at_once(signum, frame)
    self.signum = signum
    for sig in SIGNALS:  # a second signal ends the process now, with its line
      signal.signal(sig, exit_on_second)

  def started(self):
    _STATE['mode'] = 'graceful'

  def __enter__(self):
    import jax

    self._processes, self._outside = jax.process_count(), dict(_STATE)
    try:
      self._previous = install(self._mark)
    except ValueError:  # not the main thread: signals stay with whoever handles them there
      self._previous = {}
    _STATE['why'] = self._why
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    _STATE.update(mode=self._outside['mode'], why=self._outside['why'])

  def agreed(self, sync_point):
    """The signal every process stops on after this step, or None: with several processes, at sync
    points only, the largest any received (an all-gather)."""
    if self._processes == 1:
      return self.signum
    if not sync_point:
      return None
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.int32(self.signum or 0))
    return int(np.max(gathered)) or None


def exit_stopped(stopped):
  """The stopped line, then exit now: the checkpoint is saved and verified; what is left (Orbax's
  and TensorBoard's threads, JAX's backend shutdown) would only delay the exit by seconds."""
  logging.flush()
  sys.stdout.flush()
  _exit_now(stopped.signum, str(stopped))


def requested_platforms(environ=os.environ):
  """The platforms JAX_PLATFORMS names, in order ([] when unset or empty: JAX picks)."""
  return [p.strip() for p in environ.get('JAX_PLATFORMS', '').split(',') if p.strip()]


def plugins():
  """Names of the installed JAX PJRT plugins (e.g. 'xla_cuda12'), as JAX discovers them."""
  names = [e.name for e in importlib.metadata.entry_points(group='jax_plugins')]
  if importlib.util.find_spec('jax_plugins') is not None:
    import jax_plugins

    names += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
  return names


def nvidia_driver():
  """Whether an NVIDIA driver is visible on this host."""
  return any(os.path.exists(path) for path in NVIDIA_DRIVER)


def gpu_runs(environ=os.environ):
  """Whether a run started with `environ` can use a GPU (for GPU-only settings)."""
  names = requested_platforms(environ)
  wants = not names or any(p in ('gpu', 'cuda', 'rocm') for p in names)
  return wants and any('cuda' in p or 'rocm' in p for p in plugins())


def _missing(platform):
  """Why `platform` cannot start here (no libtpu, no JAX GPU plugin, no NVIDIA driver), or None."""
  if platform not in KNOWN_PLATFORMS:
    return f'{platform!r} is not a JAX platform (choose from {", ".join(KNOWN_PLATFORMS)})'
  installed = plugins()
  if platform == 'tpu' and importlib.util.find_spec('libtpu') is None:
    return "'tpu' needs the TPU runtime (pip install 'jax[tpu]'), which is not installed"
  if platform in ('gpu', 'cuda', 'rocm'):
    kinds = ('cuda', 'rocm') if platform == 'gpu' else (platform,)
    found = [k for k in kinds if any(k in p for p in installed)]
    if not found:
      return (
        f'{platform!r} needs a JAX GPU plugin (pip install "jax[cuda12]"), which is not installed'
      )
    if found == ['cuda'] and not nvidia_driver():
      return f'{platform!r} needs an NVIDIA GPU and driver, and this host shows none'
  return None


def check_platforms(environ=os.environ):
  """One-line ValueError when a platform JAX_PLATFORMS names cannot start on this host."""
  for platform in requested_platforms(environ):
    why = _missing(platform)
    if why:
      raise ValueError(
        f'JAX_PLATFORMS={environ["JAX_PLATFORMS"]}: {why}: unset JAX_PLATFORMS '
        '(JAX then picks what the host has) or name a platform it has, e.g. cpu'
      )


def memory_stat(devices, key):
  """`key` of each device's memory_stats() (e.g. 'bytes_limit'), for the devices reporting it."""
  values = []
  for device in devices:
    try:
      stats = device.memory_stats()
    except Exception:  # backends without memory statistics (each raises its own kind)
      stats = None
    if stats and stats.get(key) is not None:
      values.append(int(stats[key]))
  return values


def device_memory(devices):
  """The smallest `bytes_limit` the devices report, or None when none reports one (CPU)."""
  limits = [v for v in memory_stat(devices, 'bytes_limit') if v]
  return min(limits) if limits else None


def memory_settings(env=os.environ, separator=', ', none=JAX_DEFAULT):
  """'NAME=value' of each MEMORY_VARIABLES entry set in `env`, joined; `none` if none is set."""
  found = [f'{name}={env[name]}' for name in MEMORY_VARIABLES if name in env]
  return separator.join(found) if found else none


def initialize_distributed(config):
  """jax.distributed.initialize when config.distributed.initialize is 'yes', or 'auto' and the
  config or the environment names a multi-process job."""
  import jax

  d, env = config.distributed, os.environ
  fields = ('coordinator_address', 'num_processes', 'process_id')
  cluster = {name: d[name] for name in fields} if d.coordinator_address else {}
  mode = 'yes' if d.initialize == 'auto' and cluster else d.initialize
  if mode == 'auto':  # a multi-process job the environment names: coordinator, SLURM, MPI, TPU
    tasks = [int(env.get(name) or 1) for name in ('SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE')]
    hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]
    if env.get('JAX_COORDINATOR_ADDRESS') or max(tasks) > 1 or len(hosts) > 1:
      mode = 'yes'
  if mode == 'yes':
    jax.distributed.initialize(**cluster)
    logging.info('jax.distributed: process %d of %d', jax.process_index(), jax.process_count())


def barrier(name, timeout_s=900):
  """Wait for every process at `name` via the coordination service (gloo gives up after 30 s)."""
  import jax

  if jax.process_count() == 1:
    return
  import orbax.checkpoint as ocp

  # Naming the processes makes Orbax wait at the coordination service's barrier; without them it
  # would run a device collective (jax.experimental.multihost_utils.sync_global_devices).
  ocp.multihost.sync_global_processes(
    name, timeout=timeout_s, processes=set(range(jax.process_count()))
  )


_PRECOMPILED = [0]


def precompile(fn, *abstract_args):
  """With several processes, `fn` compiled for `abstract_args`, then the others met (none in a
  collective while another compiles); with one, `fn`."""
  import jax

  if jax.process_count() == 1:
    return fn
  compiled = fn.lower(*abstract_args).compile()
  _PRECOMPILED[0] += 1
  barrier(f'precompiled_{_PRECOMPILED[0]}')
  return compiled


def execution_facts():
  """Where this run executes (runrecord/record.py LAYOUT and CPU_FACTS)."""
  import jax

  from numerics import setup as numerics_setup
  from runrecord import record

  device = jax.devices()[0]
  cpu = numerics_setup.cpu_facts() if device.platform == 'cpu' else (None,) * 3
  return {
    'platform': device.platform,
    'device_kind': device.device_kind,
    **dict(zip(record.CPU_FACTS, cpu, strict=True)),
    'num_devices': jax.device_count(),
    'num_processes': jax.process_count(),
  }


def versions():
  """The installed version of each VERSIONED_PACKAGES package (None where it is not installed)."""
  out = {}
  for name in VERSIONED_PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def _from_orbax(record):
  """Whether a log record comes from Orbax: its own modules, or an asyncio task of one."""
  if '/orbax/' in record.pathname:
    return True
  if record.name != 'asyncio':
    return False
  trace = record.exc_info[2] if record.exc_info else None
  if any('/orbax/' in frame.f_code.co_filename for frame, _ in traceback.walk_tb(trace)):
    return True
  return '/orbax/' in record.getMessage()


class QuietLibraries(std_logging.Filter):
  """Drops Orbax's INFO chatter and the tracebacks its threads log (re-raised in the main thread),
  and JAX's INFO lines; warnings stay."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.name.startswith('jax.') and record.levelno < std_logging.WARNING:
      return False
    return not _from_orbax(record) or (
      record.levelno >= std_logging.WARNING and not record.exc_info
    )


def quiet_abandoned_work():
  """Drop what Orbax's abandoned asynchronous work prints through sys.excepthook/unraisablehook."""
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

  def closed_loop(exc):
    return isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'

  def on_exception(kind, exc, trace):
    if not closed_loop(exc):
      excepthook(kind, exc, trace)

  def on_unraisable(info):
    code = getattr(info.object, 'cr_code', None)  # an Orbax coroutine, abandoned
    if not (closed_loop(info.exc_value) or (code and '/orbax/' in code.co_filename)):
      unraisablehook(info)

  sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


def quiet_libraries():
  """QuietLibraries on absl's handler, TensorFlow's C++ INFO lines off, quiet_abandoned_work."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.get_absl_handler().addFilter(QuietLibraries())
  quiet_abandoned_work()
