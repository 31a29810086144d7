"""How one command of a GPU-agenda part runs (benchmarks/gpu_evidence.py runs the parts): as a
subprocess stopped at the part's time limit, in this process in smoke mode, or as a call; and
whether it met its criterion (step_failure).
"""

import contextlib
import importlib
import os
import re
import signal
import subprocess
import traceback

from benchmarks import gpu_evidence_parts as agenda

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


GRACE_S = 20  # after SIGTERM, before SIGKILL (the sweep stops its runs in between)


MISSING_MODULE = re.compile(r"No module named '?([\w.]+)'?")


def environment(step):
  """This process's environment (smoke mode's settings included) with the step's."""
  env = {**os.environ, 'PYTHONUNBUFFERED': '1', **step.env}
  env['PYTHONPATH'] = REPO + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  return env


def run_command(step, ctx, seconds_left):
  """Exit code of the step's subprocess (None: stopped at the part's time limit)."""
  with (
    open(os.path.join(ctx.folder, step.label + '.txt'), 'w') as out,
    open(os.path.join(ctx.folder, step.label + '.err'), 'w') as err,
  ):
    proc = subprocess.Popen(
      step.argv, cwd=REPO, env=environment(step), stdout=out, stderr=err, start_new_session=True
    )
    try:
      return proc.wait(timeout=max(1.0, seconds_left))
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGTERM)
      try:
        proc.wait(timeout=GRACE_S)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
      return None


def in_process(step, ctx):
  """Smoke mode runs `python -m benchmarks.X ...` and `python -m sweeps.sweep ...` as X.main(args)
  in this process (the same argv, parsed the same way): one set of imports and in-memory
  compilations for every toy part instead of a process each."""
  return (
    ctx.smoke
    and not step.env
    and step.argv[1] == '-m'
    and step.argv[2].startswith(('benchmarks.', 'sweeps.'))
  )


def run_module(step, ctx):
  """Exit code of module.main(argv) run here, its stdout and stderr in the step's files."""
  with (
    open(os.path.join(ctx.folder, step.label + '.txt'), 'w') as out,
    open(os.path.join(ctx.folder, step.label + '.err'), 'w') as err,
    contextlib.redirect_stdout(out),
    contextlib.redirect_stderr(err),
  ):
    try:
      code = importlib.import_module(step.argv[2]).main(step.argv[3:])
    except SystemExit as e:
      code = e.code
    except Exception:  # a failed command is a result of the part
      traceback.print_exc()
      code = 1
  return code if isinstance(code, int) else (0 if code is None else 2)


def run_call(step, ctx):
  """0 when the in-process step returns (its text in <label>.txt), else 1 (the error in .err)."""
  try:
    text = step.call(ctx)
  except (Exception, SystemExit) as e:  # a failed step is a result of the part
    with open(os.path.join(ctx.folder, step.label + '.err'), 'w') as f:
      f.write(f'{type(e).__name__}: {e}\n')
    return 1
  with open(os.path.join(ctx.folder, step.label + '.txt'), 'w') as f:
    f.write(text + '\n')
  return 0


def missing_module(ctx, step):
  """The module a command's stderr says is missing ("No module named 'pytest'"), or None."""
  found = MISSING_MODULE.findall(agenda.read(os.path.join(ctx.folder, step.label + '.err')))
  return found[-1] if found else None


def step_failure(step, ctx, code):
  """None when the command ran as expected and met its criterion, else why not (one line): its
  exit code, the module its stderr says is missing, the criterion it did not meet."""
  why = None
  if code is None:
    why = 'timed out'
  elif code not in step.ok:
    why = f'exit {code}'
  elif step.expect:
    why = step.expect(ctx, step)
  if why is None:
    return None
  module = missing_module(ctx, step)
  return f'{why}; missing module {module} (No module named {module})' if module else why
