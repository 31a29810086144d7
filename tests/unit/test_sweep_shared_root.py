"""Two sweeps on one root at once (sweeps/runner.py with trainer/checkpoint.py's run claims): each
run is started once, by one sweep, into one log; the other sweep waits for it and counts it done."""

import io
import os
import sys
import threading

from runrecord import record
from sweeps import runner
from tests.support.planted_runs import fake_runs
from trainer import checkpoint

# A stand-in for train.py: a second, then the run is complete (a file the test reads as such).
RUN = 'import sys, time; time.sleep(1.0); print("ran"); open(sys.argv[1] + "/done", "w").close()'


def test_two_sweeps_on_one_root_start_each_run_once(tmp_path):
  runs = fake_runs(tmp_path, 6)
  outs, returned = [io.StringIO(), io.StringIO()], [None, None]

  def sweep_once(i):
    progress = runner.Progress(len(runs), 0, 2, out=outs[i])
    returned[i] = runner.run_all(
      runs,
      lambda run: [sys.executable, '-c', RUN, run.workdir],
      str(tmp_path),
      progress,
      2,
      [],
      poll=0.05,
      is_completed=lambda run: os.path.exists(os.path.join(run.workdir, 'done')),
    )
    returned[i] += (progress.done,)

  threads = [threading.Thread(target=sweep_once, args=(i,)) for i in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=120)
  texts = [out.getvalue() for out in outs]
  # No false FAILED, nothing in use, both sweeps end with every run done.
  assert returned == [([], [], None, 6), ([], [], None, 6)], texts
  assert 'FAILED' not in texts[0] + texts[1]
  started = [line for text in texts for line in text.splitlines() if line.startswith('start ')]
  assert len(started) == len(runs)  # each run started by exactly one of the sweeps
  lines = [line for text in texts for line in text.splitlines()]
  assert sum(line.startswith('done ') and 'completed elsewhere' in line for line in lines) == len(
    runs
  )
  for run in runs:
    log = open(os.path.join(run.workdir, runner.LOG_FILE)).read()
    assert log.count('\n# ') == 1 and log.count('\nran\n') == 1, log  # one owner wrote the log
    assert checkpoint.claim(run.workdir) is not None  # every claim was released


def test_a_claim_is_exclusive_and_dies_with_its_holder(tmp_path):
  workdir = str(tmp_path / 'run')
  held = checkpoint.claim(workdir)
  assert held is not None and checkpoint.claim(workdir) is None
  assert checkpoint.claimant(workdir)['pid'] == os.getpid()
  checkpoint.release_claim(held)
  again = checkpoint.claim(workdir)
  assert again is not None
  checkpoint.release_claim(again)


def test_completed_opens_no_checkpoint_manager_for_a_fresh_run(tmp_path, monkeypatch):
  """runner.completed (asked of every run before it starts) reads a run's results only once it
  has a checkpoints folder, as the sweep's plan does (runner.saved_results)."""

  opened = []
  monkeypatch.setattr(record, 'read_results', lambda workdir: opened.append(workdir) or None)
  run = fake_runs(tmp_path, 1)[0]
  assert not runner.completed(run) and opened == []
  os.makedirs(record.checkpoint_dir(run.workdir))
  assert not runner.completed(run) and opened == [run.workdir]
