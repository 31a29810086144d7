"""The stop's bound (trainer/process.py, trainer/train.py): a signal is read at the next step
boundary the host reaches, and the host is never more than process.STEPS_IN_FLIGHT steps ahead of
the device, so a stop waits for at most that many steps and runs no log or evaluation of a later
step.

The device is made slow on purpose (a chain of matrix products after each step, as a big model's
step would be), and the signal is sent when the device has finished a known step (a thread waits
for each step's output), so the test counts steps, it does not time them.
benchmarks/bench_stop_latency.py measures the seconds.
"""

import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from runrecord import record
from tests.support.faults_common import metric_records, saved_steps, smoke_config
from trainer import process, train

SLOW_PRODUCTS = 300  # 256 x 256 products on one device after each step: ~0.2 s a step
SIGNAL_AFTER = 3  # SIGINT once the device has finished this step


def slow_device(step_fn, mesh, markers):
  """`step_fn`, then SLOW_PRODUCTS products on the first device only (one core: the host keeps
  the other) that the new state waits for; each step's counter (a copy nothing donates: ready when
  the device has finished the step) is appended to `markers`."""

  def products(step):
    def heavy(step):
      x = jnp.full((256, 256), 1e-3, jnp.float32)
      x = jax.lax.fori_loop(0, SLOW_PRODUCTS, lambda _, m: jnp.tanh(m @ m), x)
      return step + (x[0, 0] > 2).astype(step.dtype)

    return jax.lax.cond(jax.lax.axis_index('data') == 0, heavy, lambda s: s, step)

  @jax.jit
  def slow(state):
    step = jax.shard_map(products, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(
      state['step']
    )
    return {**state, 'step': step}, step + 0

  def step(state, batch):
    state, marker = slow(step_fn(state, batch))
    markers.append(marker)
    return state

  return step


def signal_when_finished(markers, step, sent):
  """A thread: SIGINT to this process once the device has finished `step`; `sent` gets the
  number of steps the device had finished when it was sent."""

  def watch():
    while len(markers) < step:
      time.sleep(0.005)
    markers[step - 1].block_until_ready()
    sent.append(sum(m.is_ready() for m in list(markers)))
    os.kill(os.getpid(), signal.SIGINT)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


@pytest.fixture
def slow_steps(monkeypatch):
  markers, enter_phase = [], train.enter_phase

  def slow_enter_phase(ctx, state, phase, step):
    state, step_fn = enter_phase(ctx, state, phase, step)
    return state, slow_device(step_fn, ctx.mesh, markers)

  monkeypatch.setattr(train, 'enter_phase', slow_enter_phase)
  return markers


@pytest.mark.timeout(300)
def test_a_signal_stops_within_the_steps_in_flight_and_skips_the_epochs_evaluation(
  tmp_path, slow_steps
):
  """log_every_steps=100 (no log before the epoch's end at step 22): SIGINT once the device has
  finished step 3 stops at most STEPS_IN_FLIGHT + 1 steps after the last step the device had
  finished when the signal was sent (the + 1: a step the host may be dispatching as it arrives),
  with that step's checkpoint, and no log, evaluation or epoch record of the epoch it cut short.
  Before the bound the host ran ahead by up to an epoch: it stopped after step 14 here, or, with
  the signal later in the epoch, evaluated the epoch and stopped after step 23."""
  workdir = tmp_path / 'w'
  config = smoke_config(log_every_steps=100, checkpoint_every_steps=0)
  sent = []
  signal_when_finished(slow_steps, SIGNAL_AFTER, sent)
  with pytest.raises(process.Stopped) as stopped:
    train.train_and_evaluate(config, str(workdir))
  step = stopped.value.step
  assert sent and SIGNAL_AFTER <= sent[0] <= step <= sent[0] + process.STEPS_IN_FLIGHT + 1, (
    sent,
    step,
  )
  assert saved_steps(workdir) == [step]
  saved = record.read_results(str(workdir))
  assert saved['status'] == 'running' and saved['step'] == step and saved['history'] == []
  assert not (workdir / 'metrics.jsonl').exists() or metric_records(workdir) == []
