"""What sweeps.sweep checks before it launches a run or writes a file, all problems at once.

  errors, warnings, states = checks.check(runs, root, files, saved_state)

- config: every run's config as sweeps.sweep resolved it (trainer/validation.resolve, the checks
  train.py runs before any compute); a problem shared by several runs is one line naming them;
- data: once per distinct data setting; CelebA needs the five official files in
  data.manual_dir, or a tfds_dir this project prepared, and preparing needs tensorflow-datasets
  unless a decoded cache exists; the decoded cache must be local (it is memory-mapped);
- workdir: the root, every run folder and the command-list/SLURM files must be creatable and
  writable (probed with os.access, nothing created), and a saved run in a run folder must be this
  sweep's run by runrecord/record.py's same-run rule (sweeps.sweep.saved_state).

Bucket roots (gs://...) run elsewhere: their folders are not probed, and their data problems are
warnings (the data lives on the hosts). Each problem is one line `<field>: <fix>`.
"""

import importlib.util
import os


TFDS_PACKAGE = 'tensorflow_datasets'


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


def celeba_problems(data):
  """What stops CelebA from loading with `data` (config.data), without reading the images."""
  from input_pipeline import celeba, celeba_files, celeba_tfds  # pylint: disable=import-outside-toplevel
  try:
    manual_dir, tfds_dir, cache_dir = celeba.data_dirs(data)
  except (OSError, ValueError) as e:
    return [str(e).splitlines()[0]]
  prepared = '://' in tfds_dir or celeba_tfds.prepared_source(tfds_dir) is not None
  if not manual_dir:
    return [] if prepared else [
        f'config.data.tfds_dir={tfds_dir!r} holds no CelebA prepared by this project: set '
        'config.data.manual_dir to the folder holding the five official files']
  try:
    celeba_files.check_present(manual_dir)
  except (OSError, ValueError) as e:
    return [str(e).splitlines()[0]]
  if not (prepared or celeba.has_decoded_cache(cache_dir)
          or importlib.util.find_spec(TFDS_PACKAGE) is not None):
    return [celeba_tfds.missing_tfds(f'config.data.manual_dir={manual_dir!r}')]
  return []


def data_problems(runs):
  """One line per problem of each distinct data setting (only CelebA reads files)."""
  seen, problems = {}, []
  for run in runs:
    data = run.config.data
    key = repr(sorted(data.to_dict().items()))
    if key in seen or data.name != 'celeba':
      continue
    seen[key] = True
    problems += celeba_problems(data)
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


def workdir_problems(runs, root, files, saved_state):
  """The root, the run folders and the emitted files must be writable; saved runs must match."""
  folders = {os.path.abspath(root): '--root'}
  for flag, path in files:
    folders.setdefault(os.path.dirname(os.path.abspath(path)), f'{flag}={path}: folder')
  problems = [p for p in (folder_problem(f, what) for f, what in folders.items()) if p]
  if problems:
    return problems, {}
  states = {}
  for run in runs:
    problem = folder_problem(run.workdir, '--workdir') if os.path.exists(run.workdir) else None
    state, detail = ('todo', '') if problem else saved_state(run)
    if state == 'mismatch':
      problem = detail
    problems += [problem] if problem else []
    states[run.workdir] = (state, detail)
  return problems, states


def check(runs, root, files, saved_state):
  """(errors, warnings, states): every problem of the sweep before anything is launched or written.

  `runs`: sweeps.sweep.Run, each with its config; `files`: [(flag, path)] of the files it writes;
  `saved_state(run)`: ('completed'|'todo'|'mismatch', detail) of a run folder's saved record.
  `states` maps each local run folder to its saved state (empty for bucket roots).
  """
  errors = config_problems(runs)
  data = data_problems(runs)
  if '://' in root:
    return errors, [f'{p} (checked on this machine; the hosts need it)' for p in data], {}
  folders, states = workdir_problems(runs, root, files, saved_state)
  return errors + data + folders, [], states
