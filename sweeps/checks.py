"""What sweeps.sweep checks before it launches a run or writes a file, all problems at once.

  errors, warnings, states = checks.check(runs, root, files, saved_state)

Every run's config as resolved (configs/validation.py, the checks train.py runs); its data, once
per distinct setting, as its dataset module declares (input_pipeline/registry.py `problems`); the
platforms JAX_PLATFORMS names; its batches and activations against the devices a run of this sweep
sees (counted by a child process with the run's environment: `devices_seen`); the root, the run
folders and the emitted files (writable, each entry the kind a run uses, a saved run this sweep's
by runrecord/record.py's rule). A problem shared by several runs is one line naming them; a
bucket root's data problems are warnings. See docs/operations.md ("Sweeps and studies").
"""

import functools
import json
import os
import subprocess
import sys

from configs import capacity, validation
from input_pipeline import registry
from runrecord import record
from sweeps import tpu_chips
from trainer import lock, platforms, workdirs

LOG_FILE = record.LOG_FILE  # each run's console output, appended by sweeps/runner.py
# What a train.py process holds besides its activations (Python, JAX, the data, the compiled
# steps): about 0.8 GB measured for a digits run on CPU; rounded up.
RUN_OVERHEAD_BYTES = 2**30


def run_names(runs):
  """'profile-f32/seed0, profile-f32/seed1 and 13 more' for a problem shared by `runs`."""
  names = [f'{r.slug}/seed{r.seed}' for r in runs]
  return ', '.join(names[:3]) + (f' and {len(names) - 3} more' if len(names) > 3 else '')


def config_problems(runs):
  """One line per distinct reason a run's config does not resolve (sweeps.sweep.Run.problem),
  with the runs it applies to."""
  by_message = {}
  for run in runs:
    if run.problem:
      by_message.setdefault(run.problem, []).append(run)
  return [f'{message} (runs: {run_names(failing)})' for message, failing in by_message.items()]


def data_problems(runs):
  """One line per problem of each distinct data setting, as its dataset module declares them
  (input_pipeline/registry.py `problems`)."""
  seen, problems = {}, []
  for run in runs:
    data = run.config.data
    key = repr(sorted(data.to_dict().items()))
    if key in seen:
      continue
    seen[key] = True
    try:
      check = registry.get(data.name).problems
    except ValueError:  # no such dataset: config_problems says so
      continue
    problems += check(data) if check else []
  return problems


def nearest_existing(path):
  """`path` or its closest existing ancestor."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def folder_problem(folder, what):
  """None if `folder` exists as a writable folder or could be created; else one line."""
  existing = nearest_existing(folder)
  itself = existing == os.path.abspath(folder)
  where = f'{what}={folder}' + ('' if itself else f' cannot be created: {existing}')
  if not os.path.isdir(existing):
    return f'{where} is a file, not a folder: choose another path'
  if not os.access(existing, os.W_OK | os.X_OK):
    return f'{where} is not writable: choose a folder you can write to, or fix its permissions'
  return None


def run_folder_problem(workdir):
  """None if the existing run folder and what it holds are the kinds of entry a run and its log
  (LOG_FILE) use (trainer/workdirs.py check_layout); else one line."""
  problem = folder_problem(workdir, '--workdir')
  if problem:
    return problem
  try:
    workdirs.check_layout(workdir, extra_files=lock.FILES + (LOG_FILE,))
  except validation.ConfigError as e:
    return str(e)
  return None


# Started in a child process with a run's environment: how many devices (and of which platform) it
# sees, and their smallest memory where they report one.
DEVICE_PROBE = """
import json, jax
def limit(device):
  try:
    return (device.memory_stats() or {}).get('bytes_limit')
  except Exception:  # backends without memory statistics (CPU)
    return None
limits = [v for v in map(limit, jax.local_devices()) if v]
print(json.dumps([jax.device_count(), jax.devices()[0].platform, min(limits) if limits else None]))
"""
# What the probe leaves out of a run's environment: it compiles nothing and allocates nothing.
PROBE_ENV = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false', 'JAX_COMPILATION_CACHE_DIR': None}


@functools.lru_cache(maxsize=None)
def devices_seen(environment):
  """(device count, platform, smallest device memory or None) a process started with
  `environment` ((name, value) pairs) sees, or None when JAX does not start there."""
  env = {k: v for k, v in dict(environment).items() if PROBE_ENV.get(k, '') is not None}
  env.update({k: v for k, v in PROBE_ENV.items() if v is not None})
  try:
    probe = subprocess.run(
      [sys.executable, '-c', DEVICE_PROBE],
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
    )
    return (
      tuple(json.loads(probe.stdout.strip().splitlines()[-1])) if probe.returncode == 0 else None
    )
  except (subprocess.SubprocessError, OSError, ValueError, IndexError):
    return None


def run_environment(run, env):
  """The environment of `run`'s train.py: the sweep's for its runs (`env`) with the config's own
  XLA flags added, as numerics.setup.configure adds them."""
  from numerics import setup as numerics_setup  # JAX: only once a run is checked, not for --help

  flags = env.get('XLA_FLAGS', '').split()
  flags += [f for f in numerics_setup.xla_flags(run.config) if f not in flags]
  return tuple(sorted({**env, 'XLA_FLAGS': ' '.join(flags)}.items()))


def device_problems(runs, env):
  """(errors, warnings): one error per distinct reason a run's batches do not split over (or its
  activations do not fit) the devices a run started with `env` sees (capacity.check_devices),
  naming the runs; a warning when the devices cannot be counted here. Runs of a multi-process
  job (config.distributed) are left to train.py: their devices are the job's."""
  by_message, warnings = {}, []
  for run in runs:
    if run.problem or run.config is None or run.config.distributed.initialize == 'yes':
      continue
    seen = devices_seen(run_environment(run, env))
    if seen is None:
      warnings.append(
        'the devices a run sees could not be counted here (JAX did not start in a '
        'child process): each run checks its batch sizes against them'
      )
      continue
    count, platform, memory = seen
    try:
      capacity.check_devices(run.config, count, 1, memory)
    except validation.ConfigError as e:
      message = f'{e} (the {count} {platform} device(s) a run of this sweep sees)'
      by_message.setdefault(message, []).append(run)
  errors = [f'{message} (runs: {run_names(failing)})' for message, failing in by_message.items()]
  return errors, sorted(set(warnings))


def environment_problems():
  """The platforms JAX_PLATFORMS names must start on this host (trainer/platforms.py)."""
  try:
    platforms.check()
  except ValueError as e:
    return [str(e)]
  return []


def workdir_problems(runs, root, files, saved_state):
  """The root, the run folders and the emitted files must be writable; saved runs must match."""
  try:
    workdirs.check_path_encoding(root, '--root')
  except validation.ConfigError as e:
    return [str(e)], {}
  folders = {os.path.abspath(root): '--root'}
  for flag, path in files:
    folders.setdefault(os.path.dirname(os.path.abspath(path)), f'{flag}={path}: folder')
  problems = [p for p in (folder_problem(f, what) for f, what in folders.items()) if p]
  if problems:
    return problems, {}
  states = {}
  for run in runs:
    problem = run_folder_problem(run.workdir) if os.path.exists(run.workdir) else None
    state, detail = ('todo', '') if problem else saved_state(run)
    if state == 'mismatch':
      problem = detail
    problems += [problem] if problem else []
    states[run.workdir] = (state, detail)
  return problems, states


def check(runs, root, files, saved_state, env=None):
  """(errors, warnings, states): every problem of the sweep before anything is launched or written.

  `runs`: sweeps.sweep.Run, each with its config; `files`: [(flag, path)] of the files it writes;
  `saved_state(run)`: ('completed'|'todo'|'mismatch', detail) of a run folder's saved record;
  `env`: the environment a run starts with (sweeps/runner.py child_env; None: the devices are
  not checked). `states` maps each local run folder to its saved state (empty for bucket roots).
  """
  errors = config_problems(runs)
  data = data_problems(runs)
  if '://' in root:
    elsewhere = data + environment_problems()
    return errors, [f'{p} (checked on this machine; the hosts need it)' for p in elsewhere], {}
  environment = environment_problems()
  devices, warnings = (
    device_problems(runs, env) if env is not None and not environment else ([], [])
  )
  folders, states = workdir_problems(runs, root, files, saved_state)
  return errors + environment + devices + data + folders, warnings, states


def parallel_slots(requested, runs, gpus, host_bytes, cores):
  """(runs at a time, warning or None): `requested` (--parallel; None: one per GPU, else 1),
  capped by what the host holds: `host_bytes` over each run's memory (RUN_OVERHEAD_BYTES plus its
  activations, configs/capacity.py activation_bytes, for the largest run), and for runs on CPU
  (no --gpus, no GPU JAX can use) the `cores`. ValueError (one line) for fewer than 1, or more than
  --gpus has ids."""
  if requested is not None and requested < 1:
    raise ValueError(f'--parallel={requested}: give a positive number of runs at a time')
  slots = requested or len(gpus) or 1
  if gpus and slots > len(gpus):
    what = (
      ('TPU chips of --tpu-chips', 'chip')
      if isinstance(gpus[0], tpu_chips.Chip)
      else ('GPUs of --gpus', 'GPU')
    )
    raise ValueError(f'--parallel={slots} exceeds the {len(gpus)} {what[0]}; one run per {what[1]}')
  configs = [r.config for r in runs if r.config is not None and not r.problem]
  per_run = RUN_OVERHEAD_BYTES + max(
    (capacity.activation_bytes(c, c.batch_size) for c in configs), default=0
  )
  caps = (
    [
      (
        max(1, int(host_bytes // per_run)),
        f'{host_bytes / 2**30:.1f} GiB of memory hold '
        f'about that many runs of {per_run / 2**30:.1f} GiB',
      )
    ]
    if host_bytes
    else []
  )
  if not gpus and not platforms.gpu_runs():
    caps.append((max(1, cores), f'this host has {cores} CPU cores'))
  cap, why = min(caps, default=(slots, ''), key=lambda c: c[0])
  if slots <= cap:
    return slots, None
  return cap, f'--parallel={slots} capped to {cap}: {why}'
