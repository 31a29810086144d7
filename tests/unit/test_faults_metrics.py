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


def test_tensorboard_events_read_back_as_tensorboardx_writes_them(tmp_path):
  """The hand-written event file against tensorboardX's own protos and CRC: every record's framing
  checks, the first event names the file version, scalars come back with their tags and steps, and
  a resumed writer's file starts with the SessionLog START that purges later steps."""
  tensorboardx = pytest.importorskip('tensorboardX')
  import struct

  from tensorboardX.crc32c import crc32c
  from tensorboardX.proto import event_pb2

  def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

  def events(folder):
    (path,) = folder.iterdir()
    data, out = path.read_bytes(), []
    while data:
      (length,) = struct.unpack('<Q', data[:8])
      assert struct.unpack('<I', data[8:12])[0] == masked(data[:8])
      body = data[12 : 12 + length]
      assert struct.unpack('<I', data[12 + length : 16 + length])[0] == masked(body)
      out.append(event_pb2.Event.FromString(body))
      data = data[16 + length :]
    return out

  writer = metrics.TensorBoardWriter(tmp_path / 'fresh')
  writer.write_scalars(7, {'kind': 'train', 'step': 7, 'epoch': 1, 'train_loss': 0.25, 'lr': 3})
  writer.close()
  first, *scalars = events(tmp_path / 'fresh' / 'tensorboard')
  assert first.file_version == 'brain.Event:2'
  assert [(e.step, e.summary.value[0].tag, e.summary.value[0].simple_value) for e in scalars] == [
    (7, 'train/train_loss', 0.25),
    (7, 'train/lr', 3.0),
  ]
  resumed = metrics.TensorBoardWriter(tmp_path / 'resumed', resume_step=12)
  resumed.close()
  version, start = events(tmp_path / 'resumed' / 'tensorboard')
  assert (version.step, start.step) == (12, 12)
  assert start.session_log.status == event_pb2.SessionLog.START
  assert tensorboardx.__version__  # the format is the one this tensorboardX reads and writes
