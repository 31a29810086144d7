"""trainer/metrics.py's meter: images/s is training throughput (evaluations and checkpoint saves
left out), the ETA keeps every second but compiles."""

import types

import pytest

from trainer import metrics

BATCH = 8


@pytest.fixture
def clock(monkeypatch):
  """trainer/metrics.py's time.time(), set by the test: clock.now = seconds."""
  fake = types.SimpleNamespace(now=0.0)
  monkeypatch.setattr(metrics, 'time', types.SimpleNamespace(time=lambda: fake.now))
  return fake


def test_evaluation_and_save_time_leave_images_per_sec_alone(tmp_path, clock):
  reporter = metrics.ProgressClock(100)
  clock.now = 10.0
  reporter.compiled(0)  # the first step compiled; 0.1 s per step from here on
  clock.now = 11.0
  assert reporter.throughput(10, BATCH) == (80.0, 9.0)  # 90 steps left x 0.1 s
  with reporter.paused():  # the first evaluation (it compiles): 4 s
    clock.now = 15.0
  reporter.evaluated(10)
  clock.now = 16.0
  ips, eta = reporter.throughput(20, BATCH)
  assert ips == 80.0 and eta == pytest.approx(80 * 2.0 / 20)  # the compile left out of the ETA
  with reporter.paused():  # the next epoch end: evaluation 3 s, then the checkpoint 1 s
    clock.now = 19.0
  reporter.evaluated(20)
  with reporter.paused():
    clock.now = 20.0
  clock.now = 21.0  # 10 steps in 5 s of wall time, 1 s of it training
  ips, eta = reporter.throughput(30, BATCH)
  assert ips == pytest.approx(80.0)  # was 16 img/s before the meter left the pauses out
  assert eta == pytest.approx(70 * 7.0 / 30)  # per-epoch work stays in the ETA


def test_a_pause_that_began_before_a_compile_counts_only_after_it(tmp_path, clock):
  """compiled() inside a pause restarts the interval: only the pause's later part is left out."""
  reporter = metrics.ProgressClock(50)
  with reporter.paused():
    clock.now = 5.0
    reporter.compiled(0)
    clock.now = 6.0
  clock.now = 8.0
  assert reporter.throughput(4, BATCH)[0] == pytest.approx(4 * BATCH / 2.0)
