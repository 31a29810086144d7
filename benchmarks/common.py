"""What the benchmarks share: the record's first two lines (`host`: cpus, date and load, for any
benchmark), the one-line error, alternating timed windows, the 'n/a' format and on-demand GPU
memory (JAX's memory settings and their record: trainer/gpu_memory.py).

Light on purpose: the standard library only at import time (jax, flax and optax are imported
inside `environment`, which also starts the JAX backend), so a benchmark measuring its own memory
(bench_celeba_full) pays for them only where it asks for the environment line.
Reference: docs/performance.md "The benchmark scripts".
"""

import os
import platform as platform_lib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from trainer import gpu_memory


def description(doc: str) -> str:
  """A command's --help description: its docstring's first paragraph, whole (not its first line,
  which can end mid-sentence)."""
  return ' '.join(doc.split('\n\n')[0].split())


def fail(message: str) -> NoReturn:
  """One line on stderr, exit code 2: bad input, found before any compute."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def allocate_gpu_memory_on_demand() -> None:
  """XLA_PYTHON_CLIENT_PREALLOCATE=false unless a MEMORY_VARIABLES entry is set already: JAX then
  takes GPU memory as it needs it instead of 75 % of the GPU at start, which leaves room for
  another framework in the same process (torch). Call before anything starts JAX's backend; a
  backend already running keeps its allocator (the environment line says what was set)."""
  if not any(name in os.environ for name in gpu_memory.MEMORY_VARIABLES):
    os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'


def host() -> str:
  """'cpus 2 | 2026-11-25 10:00:00 UTC | load average 1.00 0.90 0.80': the end of a record line."""
  try:
    load = '%.2f %.2f %.2f' % os.getloadavg()
  except OSError:
    load = 'n/a'
  return f'cpus {os.cpu_count()} | {time.strftime("%Y-%m-%d %H:%M:%S %Z")} | load average {load}'


def environment() -> str:
  """Device, versions, date, load average and GPU memory settings: one line for the record."""
  import jax

  d = jax.devices()[0]
  jaxlib_version = getattr(jax.lib, '__version__', '')
  import flax
  import optax

  return (
    f'device: {d.platform} {getattr(d, "device_kind", "")} x{jax.device_count()} | '
    f'jax {jax.__version__}, jaxlib {jaxlib_version}, '
    f'flax {flax.__version__}, optax {optax.__version__}, python '
    f'{platform_lib.python_version()} | {host()} | '
    f'GPU memory: {gpu_memory.memory_settings()}'
  )


def command_line(module: str, argv: Sequence[str] | None) -> str:
  """'command: python -m benchmarks.<module> <arguments>': the second line of every record (the
  first of bench_celeba_full's, which prints the environment line last); `argv` None: this
  process's own arguments (sys.argv[1:])."""
  return f'command: python -m benchmarks.{module} ' + ' '.join(
    sys.argv[1:] if argv is None else argv
  )


def alternate(
  runners: Mapping[str, Callable[[int], float]], warmup: int, windows: int, steps: int
) -> dict[str, list[float]]:
  """Every runner timed in alternating windows, so a busy or throttling machine slows them all
  alike.

  Args:
    runners: {name: run(n)}, where run(n) runs n steps and returns the seconds they took.
    warmup: untimed steps of each runner first.
    windows: rounds; each times `steps` steps of every runner in turn.
    steps: steps per window.

  Returns:
    {name: [seconds per step of each window]}.
  """
  for run_steps in runners.values():
    run_steps(warmup)
  times: dict[str, list[float]] = {name: [] for name in runners}
  for _ in range(windows):
    for name, run_steps in runners.items():
      times[name].append(run_steps(steps) / steps)
  return times


def fmt(value: float | None, spec: str) -> str:
  """format(value, spec), or 'n/a' for None (a quantity not known here)."""
  return 'n/a' if value is None else format(value, spec)
