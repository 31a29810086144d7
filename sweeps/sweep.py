"""Run a study (arms x seeds, the config's `get_sweep(arg)`) as train.py runs, <root>/<arm>/seed<k>:
done runs skipped, unfinished resumed, exit 1 if one failed (docs/operations.md, "Sweeps")."""

import collections
import functools
import json
import os
import posixpath
import re
import shlex
import signal
import subprocess
import sys

import input_pipeline
from analysis import analyse as cli
from analysis import declaration
from configs import common, validation
from runrecord import files, rules
from sweeps import runner, tpu
from trainer import process

LIST_ALL, LIST_FIRST = 20, 10  # a dry run lists up to LIST_ALL commands, else the first LIST_FIRST

# config: get_config(arg) with the run's overrides, resolved (configs/validation.py); as written
# when it does not resolve, `problem` then saying why in one line.
Run = collections.namedtuple(
  'Run', 'arm slug seed overrides workdir config problem', defaults=(None, '')
)


def add_run_args(p, example_config, root_help):
  """--config, --root, --parallel, --gpus, --tpu-chips: what a sweep (and run_study) takes."""
  p.add_argument('--config', required=True, help=f'file with get_sweep(), e.g. {example_config}')
  p.add_argument('--root', required=True, help=root_help)
  p.add_argument('--parallel', type=int, help='runs at a time (default 1, or one per GPU)')
  p.add_argument('--gpus', default='', help='comma-separated GPU ids: one run per GPU')
  p.add_argument('--tpu-chips', help='comma-separated TPU chip ids: one run per chip')


def parse_args(argv):
  p = cli.Parser(
    prog='python -m sweeps.sweep',
    description="Run a study (arms x seeds, declared by the config file's get_sweep(arg)) as "
    'train.py runs.',
  )
  add_run_args(p, 'configs/digits.py:cpu', 'folder holding one workdir per run')
  p.add_argument('--emit-commands', help=f'command list (default ROOT/{runner.COMMANDS_FILE})')
  p.add_argument('--emit-slurm', help=f'SLURM array script (default ROOT/{runner.SLURM_FILE})')
  p.add_argument('--emit-study', help='with --dry-run: write the study declaration here')
  dry = 'check, list; write only what --emit-* name'
  p.add_argument('--dry-run', action='store_true', help=dry)
  p.add_argument('--estimate', action='store_true', help='a dry run that measures the device-hours')
  p.add_argument('--estimate-steps', type=int, default=3, help='steps timed per phase (--estimate)')
  p.add_argument('--estimate-tpu', metavar='TOPOLOGY', help='price from TPU programs (--estimate)')
  p.add_argument('--heartbeat', type=float, default=30.0, help='seconds between progress lines')
  return p.parse_args(argv)


# --- the runs of a study ---
def arm_slug(arm, leaves):
  """'profile-tpu-default_compute_dtype-bfloat16': from the arm alone, in its order (stable when
  arms are added or removed), each field by its last part unless another field ends the same."""
  parts = []
  for field, value in arm.items():
    leaf = field.rsplit('.', 1)[-1]
    name = leaf if [f.rsplit('.', 1)[-1] for f in leaves].count(leaf) <= 1 else field
    text = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    parts.append(f'{name}-{re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "empty"}')
  return '_'.join(parts) or 'default'


def expand(spec, root):
  """(runs, config file, arg) of `spec`'s get_sweep(arg), under `root`; a bad one: ValueError."""
  path, arg = common.split_spec(spec)
  module = common.load_module(path)
  if not hasattr(module, 'get_sweep'):
    raise ValueError(
      f'--config: {path} has no get_sweep(arg); add one returning a list of '
      'override dicts (arms x seeds)'
    )
  sweep = module.get_sweep(arg or None)
  if not sweep or not all(isinstance(o, dict) for o in sweep):
    raise ValueError(f'{path}: get_sweep() must return a non-empty list of override dicts')
  leaves = common.fields(module.get_config(arg))
  runs, seen, slugs = [], set(), {}
  for i, overrides in enumerate(sweep):
    try:
      config = common.apply_overrides(module.get_config(arg), overrides.items())
    except ValueError as e:
      raise ValueError(f'get_sweep() run {i}: {e}; use a dotted field of get_config()') from None
    arm = {k: v for k, v in overrides.items() if k != 'seed'}
    slug, seed = arm_slug(arm, leaves), int(config.seed)
    if slugs.setdefault(slug, arm) != arm:
      raise ValueError(
        f'get_sweep(): arms {slugs[slug]} and {arm} share the folder name {slug!r}; '
        'make their values differ in more than punctuation'
      )
    if (slug, seed) in seen:
      raise ValueError(f'get_sweep(): arm {slug!r} lists seed {seed} twice; each seed once per arm')
    seen.add((slug, seed))
    try:  # as written when it does not resolve, `problem` saying why in one line
      config, problem = validation.resolve(config), ''
    except validation.ConfigError as e:
      problem = str(e).splitlines()[0]
    workdir = posixpath.join(root, slug, f'seed{seed}')  # posixpath: a root may be gs://b/study
    runs.append(Run(arm, slug, seed, {'seed': seed, **arm}, workdir, config, problem))
  return runs, path, arg


def saved_state(run):
  """('completed'|'todo'|'mismatch', detail) of the run's saved record, by the rule train.py's
  resume uses (runrecord/rules.py); another run's record is a conflict, named."""
  saved, error = runner.saved_results(run.workdir)  # none in a bucket
  if error:
    return 'todo', f'unreadable results ({error}); relaunching'
  if not saved:
    return 'todo', ''
  diffs = rules.config_differences(saved.get('config'), run.config.to_dict())
  if diffs:
    return 'mismatch', (
      f'{run.workdir} holds a run with other settings ({"; ".join(diffs[:3])}): '
      'delete it or use another --root'
    )
  return ('completed' if saved.get('status') == 'completed' else 'todo'), ''


def launch_order(runs):
  """Round-robin over arms (each arm's first seed, then each arm's second, ...): runs started
  together compile different arms, and later seeds of an arm find its compiles in the cache."""
  arms = list(dict.fromkeys(r.slug for r in runs))
  rank = {id(r): i for arm in arms for i, r in enumerate(x for x in runs if x.slug == arm)}
  return sorted(runs, key=lambda r: (rank[id(r)], arms.index(r.slug)))


# --- what is checked before launch: every problem at once, a shared one in one line ---
# A train.py process besides its activations (Python, JAX, the data, the compiled steps): about
# 0.8 GB measured for a digits run on CPU; rounded up.
RUN_OVERHEAD_BYTES = 2**30


def grouped(problems):
  """'message (runs: a/seed0, a/seed1, b/seed0 and 13 more)' per message of [(message, run)]."""
  by_message = {}
  for message, run in problems:
    by_message.setdefault(message, []).append(f'{run.slug}/seed{run.seed}')
  out = []
  for message, names in by_message.items():
    more = f' and {len(names) - 3} more' if len(names) > 3 else ''
    out.append(f'{message} (runs: {", ".join(names[:3])}{more})')
  return out


def folder_problem(folder, what):
  """None if `folder` is, or could be made, a writable folder; else one line."""
  existing = os.path.abspath(folder)
  while not os.path.exists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)  # its nearest existing ancestor
  itself = existing == os.path.abspath(folder)
  where = f'{what}={folder}' + ('' if itself else f' cannot be created: {existing}')
  if not os.path.isdir(existing):
    return f'{where} is a file, not a folder: choose another path'
  if not os.access(existing, os.W_OK | os.X_OK):
    return f'{where} is not writable: choose a folder you can write to, or fix its permissions'
  return None


# Run in a child with a run's environment: its devices, their platform and smallest memory.
DEVICE_PROBE = """
import json, jax
from trainer import process
memory = process.device_memory(jax.local_devices())
print(json.dumps([jax.device_count(), jax.devices()[0].platform, memory]))
"""
# What the probe leaves out of a run's environment: it compiles nothing and allocates nothing.
PROBE_ENV = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false', 'JAX_COMPILATION_CACHE_DIR': None}


@functools.lru_cache(maxsize=None)
def devices_seen(environment):
  """(device count, platform, smallest device memory or None) a process started with
  `environment` ((name, value) pairs) sees; None when JAX does not start there."""
  env = {k: v for k, v in dict(environment).items() if PROBE_ENV.get(k, '') is not None}
  env.update({k: v for k, v in PROBE_ENV.items() if v is not None})
  argv = [sys.executable, '-c', DEVICE_PROBE]
  try:
    probe = subprocess.run(argv, cwd=runner.REPO, env=env, capture_output=True, timeout=600)
    return tuple(json.loads(probe.stdout.splitlines()[-1])) if probe.returncode == 0 else None
  except (subprocess.SubprocessError, OSError, ValueError, IndexError):
    return None


def device_problems(runs, env):
  """(errors, warnings): runs whose batches do not split over (or activations do not fit) the
  devices a run started with `env` sees; multi-process jobs are left to train.py."""
  from numerics import setup as numerics_setup

  found, warnings = [], []
  for run in runs:
    if run.problem or run.config is None or run.config.distributed.initialize == 'yes':
      continue
    flags = env.get('XLA_FLAGS', '').split()  # the run's: the sweep's and its config's own
    flags += [f for f in numerics_setup.xla_flags(run.config) if f not in flags]
    seen = devices_seen(tuple(sorted({**env, 'XLA_FLAGS': ' '.join(flags)}.items())))
    if seen is None:
      warnings.append(
        'the devices a run sees could not be counted here (JAX did not start in a '
        'child process): each run checks its batch sizes against them'
      )
      continue
    count, platform, memory = seen
    try:
      validation.check_devices(run.config, count, 1, memory)
    except validation.ConfigError as e:
      found.append((f'{e} (the {count} {platform} device(s) a run of this sweep sees)', run))
  return grouped(found), sorted(set(warnings))


def workdir_problems(runs, root, files):
  """The root, the run folders and the emitted files must be writable; saved runs must match."""
  from trainer import checkpoint

  try:
    checkpoint.check_path_encoding(root, '--root')
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
    exists = os.path.exists(run.workdir)
    problem = folder_problem(run.workdir, '--workdir') if exists else None
    try:  # an existing run folder must hold only what a run and its log write
      if exists and not problem:
        checkpoint.check_layout(run.workdir, extra_files=checkpoint.LOCK_FILES + (runner.LOG_FILE,))
    except validation.ConfigError as e:
      problem = str(e)
    state, detail = ('todo', '') if problem else saved_state(run)
    if state == 'mismatch':
      problem = detail
    problems += [problem] if problem else []
    states[run.workdir] = (state, detail)
  return problems, states


def check(runs, root, files, env=None):
  """(errors, warnings, {run folder: saved state}) before anything is launched or written;
  `files`: [(flag, path)] it writes; `env`: a run's (None: the devices are not checked)."""
  errors = grouped((r.problem, r) for r in runs if r.problem)
  data, environment = [], []  # each distinct data setting's problems, as its dataset declares them
  for spec in {repr(sorted(r.config.data.to_dict().items())): r.config.data for r in runs}.values():
    try:
      problems_of = input_pipeline.get(spec.name).problems
    except ValueError:  # no such dataset: the config's own problem says so
      continue
    data += problems_of(spec) if problems_of else []
  try:  # the platforms JAX_PLATFORMS names must start on this host
    process.check_platforms()
  except ValueError as e:
    environment = [str(e)]
  if '://' in root:
    elsewhere = data + environment
    return errors, [f'{p} (checked on this machine; the hosts need it)' for p in elsewhere], {}
  checked = env is not None and not environment
  devices, warnings = device_problems(runs, env) if checked else ([], [])
  folders, states = workdir_problems(runs, root, files)
  return errors + environment + devices + data + folders, warnings, states


def parallel_slots(requested, runs, gpus, host_bytes, cores):
  """(runs at a time, warning or None): --parallel (None: one per device, else 1) capped by the
  host's memory over a run's (RUN_OVERHEAD_BYTES + its activations) and, on CPU, its cores."""
  if requested is not None and requested < 1:
    raise ValueError(f'--parallel={requested}: give a positive number of runs at a time')
  slots = requested or len(gpus) or 1
  if gpus and slots > len(gpus):
    chips = isinstance(gpus[0], tpu.Chip)
    what = 'TPU chips of --tpu-chips' if chips else 'GPUs of --gpus'
    raise ValueError(
      f'--parallel={slots} exceeds the {len(gpus)} {what}; one run per {"chip" if chips else "GPU"}'
    )
  configs = [r.config for r in runs if r.config is not None and not r.problem]
  largest = max((validation.activation_bytes(c, c.batch_size) for c in configs), default=0)
  per_run, caps = RUN_OVERHEAD_BYTES + largest, []
  if host_bytes:
    held = f'{host_bytes / 2**30:.1f} GiB of memory hold about that many runs of'
    caps.append((max(1, int(host_bytes // per_run)), f'{held} {per_run / 2**30:.1f} GiB'))
  if not gpus and not process.gpu_runs():
    caps.append((max(1, cores), f'this host has {cores} CPU cores'))
  cap, why = min(caps, default=(slots, ''), key=lambda c: c[0])
  return (slots, None) if slots <= cap else (cap, f'--parallel={slots} capped to {cap}: {why}')


# --- what it writes before launching: the command list, the SLURM script, the declaration ---
def study_declaration(spec, root):
  """(get_study() to write or None, problem or None): a changed one is refused once runs exist."""
  declared = declaration.from_config(spec)
  path = os.path.join(root, declaration.STUDY_FILE)
  if not declared or '://' in root or not os.path.exists(path):
    return declared or None, None
  diff = declaration.differences(declaration.read_file(path), declared)
  from analysis import inputs as results

  if diff and os.path.isdir(root) and results.walk(root)[0]:
    return None, (
      f'{path}: get_study() differs from the declaration its runs were made under '
      f'({"; ".join(diff[:3])}); restore it, or use a new --root for a new study'
    )
  return (declared if diff else None), None


def main(argv=None):
  """The exit code: 0 all completed, 1 a run failed or was in use, 2 bad input, 128 + N signal N."""
  args = parse_args(argv)
  try:
    try:
      gpus = [int(g) for g in args.gpus.split(',') if g.strip()]
    except ValueError:
      raise ValueError(
        f'--gpus={args.gpus}: give comma-separated GPU ids, e.g. --gpus 0,1,2,3'
      ) from None
    chips = tpu.parse_chips(args.tpu_chips)
    if gpus and chips:
      raise ValueError('--gpus and --tpu-chips: give one of them (a run uses GPUs or a TPU chip)')
    if args.estimate_tpu and not args.estimate:
      raise ValueError('--estimate-tpu prices the runs: give it with --estimate')
    gpus = gpus or chips
    if args.estimate_steps < 1:
      raise ValueError(f'--estimate-steps={args.estimate_steps}: give a positive number of steps')
    if not 0 < args.heartbeat < float('inf'):  # NaN fails too: it would never print
      raise ValueError(f'--heartbeat={args.heartbeat}: give a positive number of seconds')
    remote = '://' in args.root
    root = args.root if remote else os.path.abspath(args.root)
    if remote and not (args.dry_run or args.estimate):
      raise ValueError(
        f'--root={args.root}: bucket roots can only be emitted (add --dry-run and run '
        'the command list on the hosts); run locally with a local folder'
      )
    runs, path, arg = expand(args.config, root)
    if '://' in root and not (args.emit_commands and args.emit_slurm):
      raise ValueError(
        f'--root={root}: the command list and the SLURM script are written on this machine, not '
        'into a bucket: give --emit-commands=FILE and --emit-slurm=FILE (local paths)'
      )
    emitted = (
      os.path.abspath(args.emit_commands or os.path.join(root, runner.COMMANDS_FILE)),
      os.path.abspath(args.emit_slurm or os.path.join(root, runner.SLURM_FILE)),
    )
    runner.check_commands(runs, path, arg, root, emitted)
    env = runner.child_env(root, gpus[0] if gpus else None)  # a run's, on its device
    flagged = list(zip(('--emit-commands', '--emit-slurm'), emitted, strict=True))
    errors, warnings, states = check(runs, root, flagged, env)
    declared, problem = study_declaration(args.config, root)
    errors += [problem] if problem else []
    slots, capped = parallel_slots(
      args.parallel, runs, gpus, input_pipeline.host_memory(), os.cpu_count() or 1
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for line in warnings + ([capped] if capped else []):
    print(f'warning: {line}', file=sys.stderr)
  if errors:
    summary = f'{len(errors)} problem(s) found before launching: nothing was run or written'
    for line in [*errors, summary]:
      print(f'error: {line}', file=sys.stderr)
    return 2
  todo = [(r, states.get(r.workdir, ('todo', ''))) for r in runs]  # a bucket's: all to run
  todo = [(r, detail) for r, (state, detail) in todo if state != 'completed']
  print(
    f'{len(runs)} runs ({len({r.slug for r in runs})} arms) under {root}: '
    f'{len(runs) - len(todo)} completed (skipped), {len(todo)} to run'
  )
  try:
    dry = args.dry_run or args.estimate
    study_file = args.emit_study or (
      None if dry or '://' in root else os.path.join(root, declaration.STUDY_FILE)
    )
    copy_to = posixpath.join(root, declaration.STUDY_FILE)
    if declared and study_file:
      files.write_file(
        study_file, declaration.dumps(declared), command='sweep', flag='--emit-study'
      )
      where = os.path.abspath(study_file)
      copy = f' (copy it to {copy_to} before the runs start)' if where != copy_to else ''
      print(f'study declaration: {where}{copy}')
    elif declared:
      print(
        f'study declaration: not written (a dry run writes only what --emit-* name; '
        f'--emit-study=FILE writes it, to copy to {copy_to} before the runs start)'
      )
    commands_file, slurm_file = emitted
    if args.emit_commands or not dry:  # with TPU chips, each line takes a free one of them
      launcher = tpu.launcher(chips) if chips else []
      text = ''.join(shlex.join(launcher + runner.command(r, path, arg)) + '\n' for r in runs)
      files.write_file(commands_file, text, command='sweep', flag='--emit-commands')
      print(f'commands: {commands_file}')
    if args.emit_slurm or not dry:
      name = 'sweep-' + os.path.splitext(os.path.basename(path))[0]
      text = runner.slurm_script(commands_file, len(runs), root, name)
      files.write_file(slurm_file, text, command='sweep', flag='--emit-slurm')
      print(f'slurm:    {slurm_file}  (sbatch {slurm_file})')
  except ValueError as e:  # a user's file in the way, or the disk full: one line
    print(f'error: {e}', file=sys.stderr)
    return 1 if isinstance(e, files.WriteFailed) else 2
  if args.dry_run or args.estimate:
    shown = todo if len(todo) <= LIST_ALL else todo[:LIST_FIRST]
    for run, detail in shown:
      line = shlex.join(runner.command(run, path, arg))
      print(f'would run: {line}' + (f'  # {detail}' if detail else ''))
    if len(shown) < len(todo):
      emit = args.emit_commands
      where = f'all in {os.path.abspath(emit)}' if emit else '--emit-commands=FILE writes all'
      print(f'... and {len(todo) - len(shown)} more ({where})')
    if chips:
      print('each run takes a free TPU chip and runs with its variables (sweeps/tpu.py):')
      for chip in chips[:slots]:
        print(f'  {chip}: {tpu.settings(tpu.environment(chip.index))}')
  if args.estimate and not todo:
    print('estimate: nothing to run, nothing to price')
    return 0
  if args.estimate:
    from sweeps import estimate

    flags_of = functools.partial(runner.config_flags, path=path, arg=arg)
    pending = [r for r, _ in todo]
    if args.estimate_tpu:  # priced from the TPU programs compiled here
      return estimate.price_arms(pending, flags_of, args.estimate_tpu, slots if chips else 1)
    cache_root = runner.REPO if remote else root  # each slot's environment, as run_all's
    envs = [runner.child_env(cache_root, g, n) for g, n in runner.slot_gpus(gpus, slots)]
    return estimate.measure_arms(pending, flags_of, envs, args.estimate_steps)
  if args.dry_run:
    return 0
  return launch([r for r, _ in todo], path, arg, root, slots, gpus, len(runs), args.heartbeat)


def launch(todo, path, arg, root, slots, gpus, total, heartbeat):
  """Run the `todo` runs; print the outcome; returns main's exit code."""
  progress = runner.Progress(total, total - len(todo), slots)
  print('each run logs to <its workdir>/train.log (tail -f one to watch it)')
  progress.show()
  argv_of = functools.partial(runner.command, path=path, arg=arg, python=sys.executable)
  failures, in_use, signum = runner.run_all(
    launch_order(todo), argv_of, root, progress, slots, gpus, heartbeat=heartbeat
  )
  if signum is not None:
    print(
      f'stopped by {signal.Signals(signum).name}: running runs were stopped and keep their '
      'last checkpoint; run the same command again to resume',
      file=sys.stderr,
    )
    return 128 + signum
  progress.show('sweep finished')
  for run, code, line in failures:
    print(f'failed: {run.workdir}: exit code {code}, last log line: {line!r}')
  for run in in_use:
    print(f'not run: {run.workdir} is in use by another live process; rerun when it has finished')
  return 1 if failures or in_use else 0


if __name__ == '__main__':
  sys.exit(main())
