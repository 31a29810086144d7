"""Running the project's commands from a test: a CLI's one-line refusal, a module or train.py in
a subprocess (or a shell script in a private mount namespace), a sweep config file, a free port
for jax.distributed, work done once per test session."""

import fcntl
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def cli_error(capsys, main, argv):
  """(exit code, stderr lines) of a CLI main that must stop with `error:` lines, no traceback."""
  with pytest.raises(SystemExit) as e:
    main(argv)
  lines = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and lines and all(line.startswith('error: ') for line in lines), lines
  return lines


def in_mount_namespace(script, cannot):
  """Run the shell `script` in a private user and mount namespace (`unshare -rm`: root there, so it
  may mount; nothing outside sees the mount), from the repository root with it on PYTHONPATH.
  Skips the test where user namespaces are not available; `cannot` says what then cannot be done.
  Returns the finished process (its output captured)."""
  if (
    shutil.which('unshare') is None
    or subprocess.run(['unshare', '-rm', 'true'], capture_output=True, check=False).returncode != 0
  ):
    pytest.skip(f'no unshare -rm here (user namespaces): {cannot}')
  return subprocess.run(
    ['unshare', '-rm', 'sh', '-c', script],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'PYTHONPATH': ROOT},
  )


def run_module(args, env=None, timeout=300):
  env = {**(env or os.environ), 'PYTHONPATH': ROOT}
  return subprocess.run(
    [sys.executable, '-m', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def assert_one_line_refusal(proc, message, workdir):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert lines[-1].startswith('error: ') and message in lines[-1], proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr and not os.path.exists(workdir)


def write_config(tmp_path, sweep_body, name='cfg.py'):
  """A config file wrapping digits with its own get_sweep (body: the returned expression)."""
  path = tmp_path / name
  path.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    f'def get_sweep(arg=None):\n  return {sweep_body}\n'
  )
  return str(path)


def free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def once_per_session(tmp_path_factory, name, make):
  """The folder `make(folder)` fills, made once per test session, also under pytest-xdist: the
  first worker makes it under a lock in the session's shared temporary folder, the others wait and
  reuse it (a module-scoped fixture is set up again each time a worker comes back to its module)."""
  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
  folder, done = shared / name, shared / f'{name}.done'
  with open(shared / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      make(folder)
      done.touch()
  return folder
