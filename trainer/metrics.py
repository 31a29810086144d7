"""What a run reports while it trains: metrics.jsonl, TensorBoard, the console line, images/s and
ETA, `heartbeat`. By hand: clu.metric_writers imports TensorFlow and cannot resume at a step."""

import contextlib
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from absl import logging
from etils import epath

from runrecord import record

HEARTBEAT_S = 10.0
# One logged record: its 'kind' ('train', 'epoch'), its 'step', and its numbers by name.
Record = Mapping[str, Any]


class MetricsWriteError(RuntimeError):
  """metrics.jsonl could not be written (disk full, permissions, ...): one line, for train.py."""


def duration(seconds, clock=False):
  """Seconds as '1h2m05s' ('2m04s' under an hour) or with `clock` '1:02:05'; '?' for None."""
  if seconds is None:
    return '?'
  h, rest = divmod(int(round(max(seconds, 0))), 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if clock else (f'{h}h' if h else '') + f'{m}m{s:02d}s'


def percent(fraction):
  """An accuracy (a fraction, as the records hold it) as the console shows it: '83.06 %'."""
  return f'{100 * float(fraction):.2f} %'


def kept_lines(source, step, warn_path=None):
  """The lines of the open metrics file `source` a run resumed at `step` keeps, one at a time; with
  `warn_path`, a warning per torn line (blank lines go silently)."""
  source.seek(0)
  for number, line in enumerate(source, 1):
    try:
      keep = bool(line.strip()) and json.loads(line).get('step', 0) <= step
    except ValueError:
      keep = False
      if warn_path is not None:
        why = 'a write cut short, e.g. by a crash or a full disk'
        logging.warning(
          '%s line %d is not a whole JSON record (%s): dropped', warn_path, number, why
        )
    if keep:
      yield line if line.endswith(b'\n') else line + b'\n'


class JsonLinesWriter:
  """metrics.jsonl: each record one line, `json.dumps(record)`; a resume drops later records."""

  def __init__(self, workdir, resume_step=0, history=()):
    self.path = epath.Path(workdir) / record.METRICS
    self._local = '://' not in str(workdir)
    self._source, self._step, self._before, self._lines, self._size = None, resume_step, [], [], 0
    self._warn = False
    self._guard(lambda: self._open_previous(history))
    self._rewrite()

  def _open_previous(self, history):
    if not self.path.exists():
      if self._step:
        logging.warning(
          '%s is missing: its epoch records are rewritten from the results record; '
          'the per-step records before step %d are lost',
          self.path,
          self._step,
        )
      self._before = [(json.dumps({'kind': 'epoch', **entry}) + '\n').encode() for entry in history]
      return
    source = self.path.open('rb')
    if self._local:
      self._source, self._warn = source, True  # the first rewrite warns of torn lines
    else:  # a bucket object: read once (no rename keeps it)
      with source:
        self._before = list(kept_lines(source, self._step, warn_path=self.path))

  def _all_lines(self):
    if self._source is not None:
      warn, self._warn = self._warn, False
      yield from kept_lines(self._source, self._step, warn_path=self.path if warn else None)
    yield from self._before
    yield from self._lines

  def _rewrite(self):
    def write():
      if not self._local:
        data = b''.join(self._all_lines())
        self.path.write_bytes(data)
        return len(data)
      size, temporary = 0, f'{self.path}.tmp'
      with open(temporary, 'wb') as f:
        for line in self._all_lines():
          f.write(line)
          size += len(line)
      os.replace(temporary, self.path)
      return size

    self._size = self._guard(write)

  def _guard(self, access):
    try:
      return access()
    except OSError as e:
      raise MetricsWriteError(
        f'{self.path} could not be read or written ({e.strerror or e}); the checkpoints are '
        'unchanged: free space or fix the workdir, then run the same command again to resume'
      ) from e

  def _changed(self):
    """Whether the file is no longer what this writer wrote (deleted, truncated, replaced)."""
    if not self._local:
      return not self.path.exists()
    try:
      return os.stat(self.path).st_size != self._size
    except FileNotFoundError:
      return True

  def write_scalars(self, step: int, scalars: Record) -> None:
    if scalars['step'] != step:
      raise ValueError(f'the record of step {step} says step {scalars["step"]}')
    line = (json.dumps(scalars) + '\n').encode()
    self._lines.append(line)
    if self._changed():
      self._rewrite()
      logging.warning(
        '%s was deleted or changed while this run was writing it: rewritten whole (%d records)',
        self.path,
        sum(1 for _ in self._all_lines()),
      )
      return

    def append():
      with self.path.open('ab') as f:
        f.write(line)

    self._guard(append)
    self._size += len(line)

  def flush(self) -> None:
    """Nothing to do: every record is on disk when `write_scalars` returns."""

  def close(self) -> None:
    if self._source is not None:
      self._source.close()
      self._source = None


def _varint(n):
  out = bytearray()
  while True:
    out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
    n >>= 7
    if not n:
      return bytes(out)


def _field(number, kind, payload):
  """A protobuf field: kind 0 varint, 1 fixed64, 2 length-delimited (payload: bytes), 5 fixed32."""
  return _varint(number << 3 | kind) + (_varint(len(payload)) if kind == 2 else b'') + payload


_CRC32C = []  # the Castagnoli table, for the TFRecord framing
for _byte in range(256):
  for _ in range(8):
    _byte = (_byte >> 1) ^ (0x82F63B78 if _byte & 1 else 0)
  _CRC32C.append(_byte)


def _masked_crc(data):
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class TensorBoardWriter:
  """TensorBoard events, '<kind>/<name>' per number; by hand (tensorboardX's imports torch)."""

  def __init__(self, workdir, resume_step=0):
    folder = epath.Path(workdir) / record.TENSORBOARD
    folder.mkdir(parents=True, exist_ok=True)
    self.path = folder / f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}'
    self._local, self._data = '://' not in str(workdir), b''
    self._write(_field(3, 2, b'brain.Event:2'), resume_step)
    if resume_step:
      self._write(_field(7, 2, _field(1, 0, _varint(1))), resume_step)  # SessionLog START

  def _write(self, payload, step):
    event = _field(1, 1, struct.pack('<d', time.time())) + _field(2, 0, _varint(step)) + payload
    head = struct.pack('<Q', len(event))
    self._data += head + struct.pack('<I', _masked_crc(head)) + event
    self._data += struct.pack('<I', _masked_crc(event))

  def write_scalars(self, step: int, scalars: Record) -> None:
    for key, value in scalars.items():
      if isinstance(value, (int, float)) and key not in ('step', 'epoch'):
        tag = _field(1, 2, f'{scalars["kind"]}/{key}'.encode())
        value = _field(1, 2, tag + _field(2, 5, struct.pack('<f', value)))
        self._write(_field(5, 2, value), step)
    self.flush()

  def flush(self) -> None:
    if self._local:  # appended; a bucket object is rewritten whole
      with open(self.path, 'ab') as f:
        f.write(self._data)
      self._data = b''
    else:
      self.path.write_bytes(self._data)

  def close(self) -> None:
    self.flush()


def console_line(scalars: Record, eta, total_steps, num_epochs, ahead):
  """Log a training record's console line, with the ETA and the compiles (`ahead`) still to come."""
  more = f' + {ahead} compile(s) to come' if ahead and eta is not None else ''
  logging.info(
    'step %d/%d (epoch %d/%d) loss %.4f acc %s lr %.2e | %.0f img/s | ETA %s%s',
    scalars['step'],
    total_steps,
    scalars['epoch'],
    num_epochs,
    scalars['train_loss'],
    percent(scalars['train_accuracy']),
    scalars['learning_rate'],
    scalars['images_per_sec'],
    duration(eta, clock=True),
    more,
  )


class MultiWriter:
  """Several writers as one (clu.metric_writers.MultiWriter's shape)."""

  def __init__(self, writers: Iterable[Any]):
    self.writers = list(writers)

  def write_scalars(self, step: int, scalars: Record) -> None:
    for writer in self.writers:
      writer.write_scalars(step, scalars)

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def create_writers(workdir, is_writer, resume_step=0, history=()):
  """metrics.jsonl and TensorBoard on process 0 (nothing elsewhere), resumed at `resume_step`
  (`history`: the epoch records, should metrics.jsonl be missing)."""
  if not is_writer:
    return MultiWriter([])
  jsonl = JsonLinesWriter(workdir, resume_step, history)
  return MultiWriter([jsonl, TensorBoardWriter(workdir, resume_step)])


def say(line):
  """A time-stamped progress line on stdout, where absl shows INFO."""
  if logging.level_info():
    print(f'{time.strftime("%H:%M:%S")} {line}', file=sys.stdout, flush=True)


@contextlib.contextmanager
def heartbeat(what, every_s=HEARTBEAT_S):
  """Print '<what>...', '<what>: still running, N s' every `every_s`, then '<what>: done in N s'."""
  start, done = time.time(), threading.Event()
  say(f'{what}...')

  def beat():
    while not done.wait(every_s):
      say(f'{what}: still running, {time.time() - start:.0f} s')

  thread = threading.Thread(target=beat, daemon=True, name='heartbeat')
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
  say(f'{what}: done in {time.time() - start:.1f} s')


class ProgressClock:
  """Images/s (evaluations, saves and compiles left out) and the ETA of a run; `ahead` counts the
  compiles still to come."""

  def __init__(self, total_steps, resume_step=0):
    self.total_steps = total_steps
    self._clock = (time.time(), resume_step)  # (time, step) where the current interval began
    self._paused = 0.0  # seconds of the current interval spent evaluating or saving
    self._clean = False  # whether the current interval holds no compile
    self._timed = [0.0, 0]  # seconds and steps of the clean intervals
    self._evaluated = False
    self.ahead = 0  # step functions still to compile (later phases, the first evaluation)

  def compiles_ahead(self, phases):
    """The run has `phases` training phases left to compile, and its first evaluation."""
    self.ahead = phases + 1

  def compiled(self, step):
    """A compile just ended, `step` steps done: the time before now is not step time."""
    self._clock, self._clean, self._paused = (time.time(), step), True, 0.0
    self.ahead = max(self.ahead - 1, 0)

  @property
  def first_evaluation(self):
    """Whether no evaluation has ended yet in this session (the next one compiles its step)."""
    return not self._evaluated

  def evaluated(self, step):
    """An evaluation ended after `step`: the first one compiled, so its time is left out."""
    if not self._evaluated:
      self._evaluated = True
      self.compiled(step)

  @contextlib.contextmanager
  def paused(self):
    """Work that is not training: left out of the images/s (the ETA keeps it)."""
    start = time.time()
    try:
      yield
    finally:
      self._paused += time.time() - max(start, self._clock[0])

  def throughput(self, step, batch_size):
    """(training images/s since the last call or compile; the ETA, None until measured)."""
    now = time.time()
    start, start_step = self._clock
    steps, seconds = max(step - start_step, 1), max(now - start, 1e-9)
    training = max(seconds - self._paused, 1e-9)
    if self._clean:
      self._timed[0] += seconds
      self._timed[1] += steps
    self._clock, self._clean, self._paused = (now, step), True, 0.0
    eta = (self.total_steps - step) * self._timed[0] / self._timed[1] if self._timed[1] else None
    return batch_size * steps / training, eta
