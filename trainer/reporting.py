"""What a run reports while it trains: a JSON-lines metrics file, TensorBoard, and the console.

`metrics.jsonl` holds one JSON object per logged step ('kind': 'train') and per epoch
('kind': 'epoch'); analysis code reads it directly. On resume, records after the restored step
are dropped (the file is read one line at a time: a 1 GB file costs no memory), so the file always describes one uninterrupted run; a torn last line (a host crash or
a full disk mid-write) is dropped with a warning; a file missing at resume gets its epoch records
back from the results record (the per-step records before the resume step are then lost, and the
warning says so). The writer keeps the file's lines: if the file is deleted or changed while the run
writes it, it is rewritten whole (with a warning) at the next record.

Images/s is training throughput: the images of the steps since the previous log over the wall
time of that interval minus the time spent in evaluations and checkpoint saves (the loop runs
those inside `paused()`), and no interval with a compile in it counts (the loop calls `compiled`
when a step function's first call returns, and `evaluated` after each evaluation: the first one
compiles). The ETA is the remaining steps times the mean wall time per step over the intervals
without a compile, evaluations and saves included, so it also covers the per-epoch work; while
compiles are still to come (a later phase's step, the first evaluation: each takes seconds to
minutes) the line says how many, since the ETA cannot hold them.

Why not CLU's metric writers and periodic actions (the flax examples' standard): in clu 0.0.12
(the latest release) `import clu.metric_writers` imports TensorFlow at once (its package imports
`SummaryWriter`, a tf.summary writer), and `clu.periodic_actions` imports `metric_writers`, so
neither loads on the core install, which has no TensorFlow (requirements.txt; tensorboardX writes
the TensorBoard files here). CLU has no JSON-lines writer either, and `ReportProgress` measures
steps/s over every interval, compiles and evaluations included, which this module leaves out.
"""

import contextlib
import json
import os
import time

from absl import logging
from etils import epath

METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'


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
      logging.warning('%s line %d is not a whole JSON record (a write cut short, e.g. by a crash '
                      'or a full disk): dropped', warn_path, number)
    if keep:
      yield line if line.endswith(b'\n') else line + b'\n'


class Reporter:
  """Writes metrics on process 0 only; every process may call it.

  The file it writes is: the records the previous session left up to the resume step (read
  again, one line at a time, from that file's own handle, which this writer keeps open: the
  renamed-over file stays readable until the run ends, so memory never holds it), or the epoch
  records of the results when it was missing; then this session's records (in memory). A local
  file is rewritten through a temporary file and a rename; a bucket file whole.
  """

  def __init__(self, workdir, total_steps, is_writer, resume_step=0, history=()):
    self.total_steps = total_steps
    self.is_writer = is_writer
    self.path = epath.Path(workdir) / METRICS
    self._local = '://' not in str(workdir)
    self._tb = None
    self._source, self._step, self._before, self._lines, self._size = None, resume_step, [], [], 0
    self._warn = False
    if is_writer:
      self._guard(lambda: self._open_previous(history))
      self._rewrite()
      try:
        import tensorboardX
        self._tb = tensorboardX.SummaryWriter(str(epath.Path(workdir) / TENSORBOARD),
                                              purge_step=resume_step or None)
      except ImportError:
        logging.warning('tensorboardX is not installed: no TensorBoard events are written')
    self._clock = (time.time(), resume_step)  # (time, step) where the current interval began
    self._paused = 0.0  # seconds of the current interval spent evaluating or saving
    self._clean = False  # whether the current interval holds no compile
    self._timed = [0.0, 0]  # seconds and steps of the clean intervals
    self._evaluated = False
    self._ahead = 0  # step functions still to compile (later phases, the first evaluation)

  def _open_previous(self, history):
    """What the resumed run keeps of the previous file (see the class doc)."""
    if not self.path.exists():
      if self._step:
        logging.warning('%s is missing: its epoch records are rewritten from the results record; '
                        'the per-step records before step %d are lost', self.path, self._step)
      self._before = [(json.dumps({'kind': 'epoch', **entry}) + '\n').encode()
                      for entry in history]
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

  def write(self, record):
    if not self.is_writer:
      return
    line = (json.dumps(record) + '\n').encode()
    self._lines.append(line)
    if self._changed():
      self._rewrite()
      logging.warning('%s was deleted or changed while this run was writing it: rewritten whole '
                      '(%d records)', self.path, sum(1 for _ in self._all_lines()))
    else:
      def append():
        with self.path.open('ab') as f:
          f.write(line)
      self._guard(append)
      self._size += len(line)
    if self._tb is not None:
      prefix = record['kind']
      for key, value in record.items():
        if isinstance(value, (int, float)) and key not in ('step', 'epoch'):
          self._tb.add_scalar(f'{prefix}/{key}', value, record['step'])
      self._tb.flush()

  def compiles_ahead(self, phases):
    """The run has `phases` training phases left to compile, and its first evaluation."""
    self._ahead = phases + 1

  def compiled(self, step):
    """A compile just ended, `step` steps done: the time before now is not step time."""
    self._clock, self._clean, self._paused = (time.time(), step), True, 0.0
    self._ahead = max(self._ahead - 1, 0)

  def evaluated(self, step):
    """An evaluation ended after `step`: the first one compiled, so its time is left out."""
    if not self._evaluated:
      self._evaluated = True
      self.compiled(step)

  @contextlib.contextmanager
  def paused(self):
    """Work that is not training (an evaluation, a checkpoint save): its wall time is left out
    of the images/s of the interval it falls in (the ETA keeps it)."""
    start = time.time()
    try:
      yield
    finally:
      self._paused += time.time() - max(start, self._clock[0])

  def throughput(self, step, batch_size):
    """Training images/s since the previous call (or the last compile), paused time left out,
    and the ETA (None until a step time without compile has been measured)."""
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

  def progress(self, step, epoch, num_epochs, loss, accuracy, lr, images_per_sec, eta):
    """The console line of a logged step: training accuracy in % (as the reports give it)."""
    ahead = f' + {self._ahead} compile(s) to come' if self._ahead and eta is not None else ''
    logging.info('step %d/%d (epoch %d/%d) loss %.4f acc %s lr %.2e | %.0f img/s | ETA %s%s',
                 step, self.total_steps, epoch + 1, num_epochs, loss, percent(accuracy), lr,
                 images_per_sec, duration(eta, clock=True), ahead)

  def close(self):
    if self._tb is not None:
      self._tb.close()
    if self._source is not None:
      self._source.close()
      self._source = None
