"""Where a run executes, as its results record says (runrecord/record.py LAYOUT and CPU_FACTS):
the platform, device kind, device and process counts and, on CPU, the processor (`facts`).
"""

from typing import Any

import jax

from numerics import setup as numerics_setup
from runrecord import record


def facts() -> dict[str, Any]:
  """Where this run executes: platform, device kind, device and process counts, and on CPU the
  processor's model, instruction set and XLA:CPU's (record.CPU_FACTS, numerics.setup.cpu_facts;
  None on GPU and TPU, whose device kind names the chip)."""
  device = jax.devices()[0]
  cpu = dict(
    zip(
      record.CPU_FACTS,
      numerics_setup.cpu_facts() if device.platform == 'cpu' else (None,) * len(record.CPU_FACTS),
      strict=True,
    )
  )
  return {
    'platform': device.platform,
    'device_kind': device.device_kind,
    **cpu,
    'num_devices': jax.device_count(),
    'num_processes': jax.process_count(),
  }
