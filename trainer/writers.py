"""The metric writers of a run, in CLU's shape (`MetricWriter`: clu.metric_writers.MetricWriter's
`write_scalars(step, scalars)`, `write_hparams`, `flush()`, `close()`; `MultiWriter`):
`JsonLinesWriter` (metrics.jsonl, one JSON object per logged step and per epoch),
`TensorBoardWriter` and `ConsoleWriter` (the training line).

At resume, metrics.jsonl loses the records after the restored step, a torn last line is dropped
with a warning, and a file missing then gets its epoch records back from the results record; a
file changed under a running run is rewritten whole. Why not CLU itself, and the console's
columns: docs/operations.md ("A training run").
"""

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from absl import logging
from etils import epath

from runrecord import record

METRICS = record.METRICS
TENSORBOARD = 'tensorboard'


# One logged record: its 'kind' ('train', 'epoch', ...), its 'step', and its numbers by name
# (docs/operations.md, "A training run"). CLU's writers take numbers only; these records also
# carry their kind, so a writer can tell them apart.
Record = Mapping[str, Any]


class MetricWriter(Protocol):
  """What the loop writes to (clu.metric_writers.MetricWriter's shape, its scalar part): every
  writer here satisfies it, and a CLU writer could stand in for one."""

  def write_scalars(self, step: int, scalars: Record) -> None:
    """Write the record `scalars` of global step `step` (its own 'step' must equal `step`)."""

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Write the run's hyperparameters (the writers here write none: the results record holds
    the whole config, runrecord/record.py)."""

  def flush(self) -> None:
    """Make what was written so far durable (readable by another process)."""

  def close(self) -> None:
    """Flush and release the writer's files; it writes nothing after."""


class MetricsWriteError(RuntimeError):
  """metrics.jsonl could not be written (disk full, permissions, ...): one line, for train.py."""


def duration(seconds, clock=False):
  """Seconds as the consoles show them (the training line's ETA, a sweep's progress, the lockstep
  divergence's): '1h2m05s' ('2m04s' under an hour), or with `clock` '1:02:05'; '?' for None (not
  known yet). Rounded to the second, a negative as 0."""
  if seconds is None:
    return '?'
  h, rest = divmod(int(round(max(seconds, 0))), 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if clock else (f'{h}h' if h else '') + f'{m}m{s:02d}s'


def percent(fraction):
  """An accuracy (a fraction, as metrics.jsonl and the results hold it) as the console shows it:
  '83.06 %', the unit of the reports."""
  return f'{100 * float(fraction):.2f} %'


def _parse(line):
  try:
    return json.loads(line)
  except ValueError:
    return None


def _kept(line, step):
  """Whether a metrics line (bytes) is kept by a run resumed at `step`: a whole JSON record up to
  `step`; blank lines go, silently. (kept, torn)."""
  if not line.strip():
    return False, False
  parsed = _parse(line)
  return parsed is not None and parsed.get('step', 0) <= step, parsed is None


def kept_lines(source, step, warn_path=None):
  """The lines (bytes, each ending in a newline) of the open binary metrics file `source` that a
  run resumed at `step` keeps (_kept), read one line at a time: memory holds one line, however
  large the file. With `warn_path`, a warning per torn line (a write cut short)."""
  source.seek(0)
  for number, line in enumerate(source, 1):
    keep, torn = _kept(line, step)
    if torn and warn_path is not None:
      logging.warning(
        '%s line %d is not a whole JSON record (a write cut short, e.g. by a crash '
        'or a full disk): dropped',
        warn_path,
        number,
      )
    if keep:
      yield line if line.endswith(b'\n') else line + b'\n'


class JsonLinesWriter:
  """metrics.jsonl: `write_scalars(step, record)` appends `record` (holding 'kind' and `step`) as
  one JSON line, byte for byte `json.dumps(record)`.

  The file it writes is: the records the previous session left up to the resume step (read
  again, one line at a time, from that file's own handle, which this writer keeps open: the
  renamed-over file stays readable until the run ends, so memory never holds it), or the epoch
  records of the results when it was missing; then this session's records (in memory). A local
  file is rewritten through a temporary file and a rename; a bucket file whole.
  """

  def __init__(self, workdir, resume_step=0, history=()):
    self.path = epath.Path(workdir) / METRICS
    self._local = '://' not in str(workdir)
    self._source, self._step, self._before, self._lines, self._size = None, resume_step, [], [], 0
    self._warn = False
    self._guard(lambda: self._open_previous(history))
    self._rewrite()

  def _open_previous(self, history):
    """What the resumed run keeps of the previous file (see the class doc)."""
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
      ) from None

  def _changed(self):
    """Whether the file is no longer what this writer wrote (deleted, truncated, replaced)."""
    if not self._local:
      return not self.path.exists()
    try:
      return os.stat(self.path).st_size != self._size
    except FileNotFoundError:
      return True

  def write_scalars(self, step: int, record: Record) -> None:
    if record['step'] != step:
      raise ValueError(f'the record of step {step} says step {record["step"]}')
    line = (json.dumps(record) + '\n').encode()
    self._lines.append(line)
    if self._changed():
      self._rewrite()
      logging.warning(
        '%s was deleted or changed while this run was writing it: rewritten whole (%d records)',
        self.path,
        sum(1 for _ in self._all_lines()),
      )
    else:

      def append():
        with self.path.open('ab') as f:
          f.write(line)

      self._guard(append)
      self._size += len(line)

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Nothing: metrics.jsonl holds metrics; the config is in the results record."""

  def flush(self) -> None:
    """Nothing to do: every record is on disk when `write_scalars` returns."""

  def close(self) -> None:
    if self._source is not None:
      self._source.close()
      self._source = None


class TensorBoardWriter:
  """TensorBoard events (tensorboardX, no TensorFlow) under <workdir>/tensorboard: each number of
  a record but its step and epoch, as '<kind>/<name>'; a resumed run purges the events after its
  step. Writes nothing (one warning) where tensorboardX is not installed."""

  def __init__(self, workdir, resume_step=0):
    self._tb = None
    try:
      import tensorboardX
    except ImportError:
      logging.warning('tensorboardX is not installed: no TensorBoard events are written')
      return
    self._tb = tensorboardX.SummaryWriter(
      str(epath.Path(workdir) / TENSORBOARD), purge_step=resume_step or None
    )

  def write_scalars(self, step: int, record: Record) -> None:
    if self._tb is None:
      return
    for key, value in record.items():
      if isinstance(value, (int, float)) and key not in ('step', 'epoch'):
        self._tb.add_scalar(f'{record["kind"]}/{key}', value, step)
    self._tb.flush()

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Nothing: the config is in the results record (no TensorBoard hparams plugin data)."""

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


class ConsoleWriter:
  """The console line of a logged training step (records of kind 'train'), with the clock's
  images/s, ETA and compiles still to come (trainer/clock.py); training accuracy in %."""

  def __init__(self, total_steps, num_epochs, clock):
    self.total_steps, self.num_epochs, self.clock = total_steps, num_epochs, clock

  def write_scalars(self, step: int, record: Record) -> None:
    if record['kind'] != 'train':
      return
    eta, ahead = record.get('eta_s'), self.clock.ahead
    more = f' + {ahead} compile(s) to come' if ahead and eta is not None else ''
    logging.info(
      'step %d/%d (epoch %d/%d) loss %.4f acc %s lr %.2e | %.0f img/s | ETA %s%s',
      step,
      self.total_steps,
      record['epoch'],
      self.num_epochs,
      record['train_loss'],
      percent(record['train_accuracy']),
      record['learning_rate'],
      record['images_per_sec'],
      duration(eta, clock=True),
      more,
    )

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Nothing: the console shows training lines only."""

  def flush(self) -> None:
    """Nothing to do: each line goes to absl logging as it is written."""

  def close(self) -> None:
    """Nothing to release."""


class MultiWriter:
  """Several writers as one (clu.metric_writers.MultiWriter's shape)."""

  def __init__(self, writers: Iterable[MetricWriter]):
    self.writers = list(writers)

  def write_scalars(self, step: int, record: Record) -> None:
    for writer in self.writers:
      writer.write_scalars(step, record)

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    for writer in self.writers:
      writer.write_hparams(hparams)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def create_writers(
  workdir: str, is_writer: bool, resume_step: int = 0, history: Iterable[Mapping[str, Any]] = ()
) -> MetricWriter:
  """The files a run writes: metrics.jsonl and TensorBoard on process 0, nothing elsewhere.

  Args:
    workdir: the run folder (local or gs://).
    is_writer: whether this process writes (process 0).
    resume_step: the step the run resumes at: later records of a previous session are dropped.
    history: the results record's epoch entries, rewritten into metrics.jsonl when it is missing.
  """
  if not is_writer:
    return MultiWriter([])
  return MultiWriter(
    [JsonLinesWriter(workdir, resume_step, history), TensorBoardWriter(workdir, resume_step)]
  )
