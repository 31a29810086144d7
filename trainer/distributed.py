"""Multi-process start-up: `jax.distributed.initialize` behind `config.distributed.initialize`.

'auto' initialises when the config names a coordinator (`distributed.coordinator_address`) or the
environment names a multi-process job (JAX_COORDINATOR_ADDRESS, a SLURM job of several tasks, an
Open MPI job, or a multi-host TPU slice); 'yes' always does; 'no' never does. With
`distributed.coordinator_address` set, `num_processes` and `process_id` must be set too (a
localhost CPU job: coordinator 'localhost:PORT', N processes, ids 0..N-1; configs/validation.py
checks them); otherwise JAX reads the cluster from the environment. On CPU the cross-process
collectives use gloo (JAX's default). See docs/operations.md.
"""

import os

import jax
from absl import logging


def cluster_detected(environ=None):
  env = os.environ if environ is None else environ
  if env.get('JAX_COORDINATOR_ADDRESS'):
    return True
  if int(env.get('SLURM_NTASKS', '1') or 1) > 1:
    return True
  if int(env.get('OMPI_COMM_WORLD_SIZE', '1') or 1) > 1:
    return True
  return len([h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1


def explicit_cluster(config):
  """{coordinator_address, num_processes, process_id} from the (resolved) config, {} if it names
  no coordinator."""
  d = config.distributed
  if not d.coordinator_address:
    return {}
  return {
    'coordinator_address': d.coordinator_address,
    'num_processes': d.num_processes,
    'process_id': d.process_id,
  }


def initialize(config):
  """jax.distributed.initialize where config.distributed.initialize says so (module doc)."""
  mode = config.distributed.initialize
  cluster = explicit_cluster(config)
  if mode == 'yes' or (mode == 'auto' and (cluster or cluster_detected())):
    jax.distributed.initialize(**cluster)
    logging.info('jax.distributed: process %d of %d', jax.process_index(), jax.process_count())


def barrier(name, timeout_s=900):
  """Wait for every process at `name` via the coordination service (not a gloo collective, whose
  context set-up gives up after 30 s). A no-op with one process."""
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
  """With several processes: compile `fn` for `abstract_args` now, then meet the others, so that no
  process enters a collective while another is still compiling (on CPU, gloo gives up after 30 s
  of waiting for a peer). Returns the compiled executable (same HLO, same arithmetic). With one
  process `fn` is returned unchanged."""
  if jax.process_count() == 1:
    return fn
  compiled = fn.lower(*abstract_args).compile()
  _PRECOMPILED[0] += 1
  barrier(f'precompiled_{_PRECOMPILED[0]}')
  return compiled
