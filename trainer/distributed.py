"""Multi-process start-up: `jax.distributed.initialize` behind `config.distributed.initialize`.

'auto' initialises when the environment names a multi-process job (JAX_COORDINATOR_ADDRESS,
a SLURM job of several tasks, an Open MPI job, or a multi-host TPU slice); 'yes' always does (JAX
then reads the cluster from the environment); 'no' never does.
"""

import os

import jax
from absl import logging

from trainer import validation

CHOICES = ('auto', 'yes', 'no')


def cluster_detected(environ=None):
  env = os.environ if environ is None else environ
  if env.get('JAX_COORDINATOR_ADDRESS'):
    return True
  if int(env.get('SLURM_NTASKS', '1') or 1) > 1:
    return True
  if int(env.get('OMPI_COMM_WORLD_SIZE', '1') or 1) > 1:
    return True
  return len([h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1


def initialize(config):
  mode = config.distributed.initialize
  if mode not in CHOICES:
    raise validation.ConfigError(f'config.distributed.initialize must be one of {CHOICES}, got '
                                 f'{mode!r}')
  if mode == 'yes' or (mode == 'auto' and cluster_detected()):
    jax.distributed.initialize()
    logging.info('jax.distributed: process %d of %d', jax.process_index(), jax.process_count())
