"""What a run reports while it trains: a JSON-lines metrics file, TensorBoard, and the console.

`metrics.jsonl` holds one JSON object per logged step ('kind': 'train') and per epoch
('kind': 'epoch'); analysis code reads it directly. On resume, records after the restored step
are dropped, so the file always describes one uninterrupted run.
"""

import json
import time

from absl import logging
from etils import epath


def _format_duration(seconds):
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class Reporter:
  """Writes metrics on process 0 only; every process may call it."""

  def __init__(self, workdir, total_steps, is_writer, resume_step=0):
    self.total_steps = total_steps
    self.is_writer = is_writer
    self.path = epath.Path(workdir) / 'metrics.jsonl'
    self._tb = None
    if is_writer:
      self._truncate_after(resume_step)
      try:
        import tensorboardX
        self._tb = tensorboardX.SummaryWriter(str(epath.Path(workdir) / 'tensorboard'),
                                              purge_step=resume_step or None)
      except ImportError:
        logging.warning('tensorboardX is not installed: no TensorBoard events are written')
    self._last_time, self._last_step = time.time(), resume_step

  def _truncate_after(self, step):
    if not self.path.exists():
      return
    keep = [line for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get('step', 0) <= step]
    self.path.write_text(''.join(line + '\n' for line in keep))

  def write(self, record):
    if not self.is_writer:
      return
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')
    if self._tb is not None:
      prefix = record['kind']
      for key, value in record.items():
        if isinstance(value, (int, float)) and key not in ('step', 'epoch'):
          self._tb.add_scalar(f'{prefix}/{key}', value, record['step'])
      self._tb.flush()

  def throughput(self, step, batch_size):
    """Images/s since the previous call, and an ETA for the rest of the run."""
    now = time.time()
    steps = max(step - self._last_step, 1)
    rate = steps / max(now - self._last_time, 1e-9)
    self._last_time, self._last_step = now, step
    return batch_size * rate, (self.total_steps - step) / rate

  def progress(self, step, epoch, num_epochs, loss, accuracy, lr, images_per_sec, eta):
    logging.info('step %d/%d (epoch %d/%d) loss %.4f acc %.4f lr %.2e | %.0f img/s | ETA %s',
                 step, self.total_steps, epoch + 1, num_epochs, loss, accuracy, lr,
                 images_per_sec, _format_duration(eta))

  def close(self):
    if self._tb is not None:
      self._tb.close()
