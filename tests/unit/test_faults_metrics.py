"""metrics.jsonl under faults (deleted mid-run, replaced, missing at resume, unwritable) and an ETA
that leaves compile time out (trainer/metrics.py)."""

import json

import pytest

from runrecord import record
from trainer import metrics


def _records(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _train(step):
  return {'kind': 'train', 'step': step, 'train_loss': 1.0 / step}


def test_metrics_deleted_mid_run_are_rewritten_whole(tmp_path, caplog):
  reporter = metrics.JsonLinesWriter(tmp_path)
  for step in (5, 10, 15):
    reporter.write_scalars(step, _train(step))
  (tmp_path / record.METRICS).unlink()
  reporter.write_scalars(20, _train(20))
  assert [r['step'] for r in _records(tmp_path / record.METRICS)] == [5, 10, 15, 20]
  assert (
    'was deleted or changed while this run was writing it: rewritten whole (4 records)'
    in caplog.text
  )
  (tmp_path / record.METRICS).write_text('{"kind": "train", "step": 99}\n')  # replaced
  reporter.write_scalars(25, _train(25))
  assert [r['step'] for r in _records(tmp_path / record.METRICS)] == [5, 10, 15, 20, 25]
  reporter.close()


def test_metrics_missing_at_resume_get_the_epoch_records_back(tmp_path, caplog):
  history = [{'epoch': 1, 'step': 22, 'train_loss': 2.0, 'test_accuracy': 0.5}]
  reporter = metrics.JsonLinesWriter(tmp_path, resume_step=30, history=history)
  assert _records(tmp_path / record.METRICS) == [{'kind': 'epoch', **history[0]}]
  assert 'the per-step records before step 30 are lost' in caplog.text
  reporter.close()


def test_unwritable_metrics_is_one_line_error(tmp_path):
  (tmp_path / record.METRICS).mkdir()  # a folder where the file should be
  with pytest.raises(
    metrics.MetricsWriteError,
    match=r'metrics.jsonl could not be read or '
    r'written \(Is a directory\); the checkpoints are unchanged',
  ):
    metrics.JsonLinesWriter(tmp_path)


class FakeClock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_eta_leaves_compile_time_out(tmp_path, monkeypatch):
  """60 s of compile, then 1 s per step: the first ETA is 1 s per remaining step (not ~13 s, as
  timing from the start would give); an interval holding the first evaluation (which compiles)
  does not count; later evaluations do."""
  clock = FakeClock()
  monkeypatch.setattr(metrics.time, 'time', clock)
  reporter = metrics.ProgressClock(100)
  clock.now += 60  # compiling the first step
  reporter.compiled(0)
  clock.now += 5
  images_per_sec, eta = reporter.throughput(5, batch_size=64)
  assert images_per_sec == 64 and eta == 95
  clock.now += 5
  assert reporter.throughput(10, 64)[1] == 90
  clock.now += 30  # the first evaluation: compiles
  reporter.evaluated(10)
  clock.now += 10
  assert reporter.throughput(20, 64) == (64, 80)
  clock.now += 2 + 10  # a later evaluation (2 s) is time the run will spend again
  reporter.evaluated(20)
  assert reporter.throughput(30, 64) == (pytest.approx(64 * 10 / 12), pytest.approx(70 * 32 / 30))


def test_eta_unknown_until_a_step_time_without_compile(tmp_path, monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(metrics.time, 'time', clock)
  reporter = metrics.ProgressClock(100)
  clock.now += 50
  assert reporter.throughput(5, 64)[1] is None  # no compile end reported: all of it may be compile
  assert metrics.duration(None, clock=True) == '?'
