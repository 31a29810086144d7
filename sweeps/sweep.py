"""Run a study (arms x seeds, declared by the config file's `get_sweep(arg)`) as train.py runs.

  python -m sweeps.sweep --config=configs/digits.py:study --root=/tmp/study [--parallel 2]
  python -m sweeps.sweep --config=configs/digits.py:study --root=/tmp/study --estimate
  python -m sweeps.sweep --config=configs/celeba.py:gpu,data.manual_dir=/data/celeba \
      --root=/runs/celeba --gpus 0,1,2,3
  python -m sweeps.sweep --config=configs/celeba.py:tpu --root=gs://b/study --dry-run \
      --emit-commands=cmds.txt --emit-slurm=study.sbatch
  python -m sweeps.sweep --config=configs/digits.py:study,model.width=1.0 --root=runs/tpu \
      --tpu-chips 0,1,2,3,4,5,6,7

Each override dict of `get_sweep(arg)` is one run, launched in `<root>/<arm slug>/seed<k>` as

  python train.py --config=<file>:<arg> --workdir=<run dir> --config.seed=<k> --config.<f>=<v> ...

after every run's config, data and workdir are checked (sweeps/checks.py: every problem one line,
exit code 2). Completed runs are skipped and unfinished ones resumed; `get_study(arg)` is written
into the root as study.json; a command list and a SLURM script are written beside the runs;
`--estimate` prices the sweep first (sweeps/estimate.py). The exit code is 1 if any run failed.
See docs/operations.md ("Sweeps and studies") and docs/statistics.md.
"""

import collections
import os
import re
import signal
import sys

from analysis import cli
from analysis.inputs import declaration
from configs import common, loader
from runrecord import sessions
from sweeps import scripts, tpu_chips

# The modules that start JAX, pandas or the runner (sweeps.checks, claims, runner, estimate,
# tpu_estimate), and configs.validation and input_pipeline.base (numpy), are imported where they
# are used: --help and a bad flag are answered before any of them loads.


# config: get_config(arg) with the run's overrides, resolved (configs/validation.py); as
# written when it does not resolve, `problem` then saying why in one line (None: runs built by hand).
Run = collections.namedtuple(
  'Run', 'arm slug seed overrides workdir config problem', defaults=(None, '')
)


def short_name(field, leaves):
  """The field's last part when no other config field ends the same way, else its dotted name."""
  leaf = field.rsplit('.', 1)[-1]
  same = [f for f in leaves if f.rsplit('.', 1)[-1] == leaf]
  return leaf if len(same) <= 1 else field


def slug_value(value):
  text = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
  return re.sub(r'[^A-Za-z0-9.+-]+', '-', text).strip('-') or 'empty'


def arm_slug(arm, leaves):
  """'profile-tpu-default_compute_dtype-bfloat16': fields in the arm's order, from the arm alone (stable
  when arms are added or removed); 'default' for an arm without overrides."""
  parts = [f'{short_name(k, leaves)}-{slug_value(v)}' for k, v in arm.items()]
  return '_'.join(parts) or 'default'


def check_overrides(module, arg, overrides, index):
  """Apply the run's overrides to the config (one-line error naming the field); returns it."""
  config = module.get_config(arg)
  try:
    return common.apply_overrides(config, overrides.items())
  except ValueError as e:
    raise ValueError(f'get_sweep() run {index}: {e}; use a dotted field of get_config()') from None


def expand(spec, root):
  """(runs, config file, arg): the sweep of `spec` with one workdir per run under `root`, each
  run with its config."""
  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  if not hasattr(module, 'get_sweep'):
    raise ValueError(
      f'--config: {path} has no get_sweep(arg); add one returning a list of '
      'override dicts (arms x seeds)'
    )
  sweep = module.get_sweep(arg or None)
  if not sweep or not all(isinstance(o, dict) for o in sweep):
    raise ValueError(f'{path}: get_sweep() must return a non-empty list of override dicts')
  leaves = common.fields(module.get_config(arg))
  runs, slugs, seen = [], {}, set()
  for i, overrides in enumerate(sweep):
    config = check_overrides(module, arg, overrides, i)
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
    workdir = scripts.join(root, slug, f'seed{seed}')
    config, problem = resolved(config)
    runs.append(Run(arm, slug, seed, {'seed': seed, **arm}, workdir, config, problem))
  return runs, path, arg


def resolved(config):
  """(the resolved config, '') or (config as written, the one-line reason it does not resolve)."""
  from configs import validation  # pylint: disable=import-outside-toplevel

  try:
    return validation.resolve(config), ''
  except validation.ConfigError as e:
    return config, str(e).splitlines()[0]


def saved_state(run):
  """('completed'|'todo'|'mismatch', detail) from the run's saved record, if any.

  A saved run is this sweep's run when runrecord/record.py's rule says so (the rule train.py's
  resume uses): then a completed one is skipped and an unfinished one relaunched, and train.py
  resumes it. Any other saved run is a conflict, named with its differing fields.
  """
  from sweeps import claims  # pylint: disable=import-outside-toplevel

  saved, error = claims.saved_results(run.workdir)  # none in a bucket: see there
  if error:
    return 'todo', f'unreadable results ({error}); relaunching'
  if not saved:
    return 'todo', ''
  diffs = sessions.config_differences(saved.get('config'), run.config.to_dict())
  if diffs:
    return 'mismatch', (
      f'{run.workdir} holds a run with other settings ({"; ".join(diffs[:3])}): '
      'delete it or use another --root'
    )
  return ('completed', '') if claims.says_completed(saved) else ('todo', '')


def launch_order(runs):
  """Round-robin over arms (each arm's first seed, then each arm's second, ...): runs started
  together compile different arms, and later seeds of an arm find its compiles in the cache."""
  arms = list(dict.fromkeys(r.slug for r in runs))
  rank = {id(r): i for arm in arms for i, r in enumerate(x for x in runs if x.slug == arm)}
  return sorted(runs, key=lambda r: (rank[id(r)], arms.index(r.slug)))


def parse_gpus(text):
  try:
    return [int(g) for g in text.split(',') if g.strip()]
  except ValueError:
    raise ValueError(f'--gpus={text}: give comma-separated GPU ids, e.g. --gpus 0,1,2,3') from None


def placement(args):
  """The slots' devices: the GPU ids of --gpus, or the TPU chips of --tpu-chips
  (tpu_chips.Chip), never both; one-line ValueError otherwise."""
  gpus, chips = parse_gpus(args.gpus), tpu_chips.parse(args.tpu_chips)
  if gpus and chips:
    raise ValueError('--gpus and --tpu-chips: give one of them (a run uses GPUs or a TPU chip)')
  if getattr(args, 'estimate_tpu', '') and not getattr(args, 'estimate', False):
    raise ValueError('--estimate-tpu prices the runs: give it with --estimate')
  return gpus or chips


def print_chip_environments(chips):
  """What each run gets on each chip (a run takes the first free chip): libtpu's variables."""
  print('each run takes a free TPU chip and runs with its variables (sweeps/tpu_chips.py):')
  for chip in chips:
    print(f'  {chip}: {tpu_chips.settings(tpu_chips.environment(chip.index))}')


def add_run_args(p, example_config, root_help):
  """--config, --root, --parallel, --gpus: what running a sweep takes (sweeps.run_study too)."""
  p.add_argument(
    '--config', required=True, help=f'config file with get_sweep(), e.g. {example_config}'
  )
  p.add_argument('--root', required=True, help=root_help)
  p.add_argument(
    '--parallel', type=int, default=None, help='runs at a time (default 1, or one per GPU)'
  )
  p.add_argument('--gpus', default='', help='comma-separated GPU ids: one run per GPU')
  p.add_argument(
    '--tpu-chips',
    default='',
    help='comma-separated TPU chip ids of this TPU VM: one run per chip, each with '
    "libtpu's per-process variables and its own port (sweeps/tpu_chips.py)",
  )


def parse_args(argv):
  p = cli.Parser(
    prog='python -m sweeps.sweep',
    description='Run a study (arms x seeds, declared '
    "by the config file's get_sweep(arg)) as train.py runs.",
  )
  add_run_args(p, 'configs/digits.py:cpu', 'folder holding one workdir per run')
  p.add_argument(
    '--emit-commands',
    default=None,
    help=f'command list file (default ROOT/{scripts.COMMANDS_FILE})',
  )
  p.add_argument(
    '--emit-slurm', default=None, help=f'SLURM array script (default ROOT/{scripts.SLURM_FILE})'
  )
  p.add_argument(
    '--emit-study',
    default=None,
    help='with --dry-run or a bucket root: write the study declaration (get_study()) '
    'to this file, to copy into the root before the runs start',
  )
  p.add_argument(
    '--dry-run',
    action='store_true',
    help='check every run and print the plan (a summary line, then the commands, or '
    'the first 10 and a count); write nothing but the files --emit-* name; run '
    'nothing',
  )
  p.add_argument(
    '--estimate',
    action='store_true',
    help="a dry run that also measures what each arm's runs spend on this machine "
    '(start-up, compiles, steps, evaluations, checkpoints), --parallel arms at a '
    "time, and prints the sweep's device-hours (sweeps/estimate.py)",
  )
  p.add_argument(
    '--estimate-steps',
    type=int,
    default=3,
    help='steps timed per training phase after the compile (--estimate)',
  )
  p.add_argument(
    '--estimate-tpu',
    default='',
    metavar='TOPOLOGY',
    help='with --estimate: price the runs from their TPU programs compiled here for '
    'TOPOLOGY (sweeps/preflight.py; e.g. v5e-1 for one run per chip) instead of '
    'measuring them on this machine',
  )
  p.add_argument(
    '--heartbeat', type=float, default=30.0, help='seconds between progress lines while runs train'
  )
  return p.parse_args(argv)


def output_files(args, root):
  """(command list, SLURM script) paths; next to the runs unless --emit-* say otherwise. A bucket
  root cannot hold them (they are written here): it needs both --emit-* flags."""
  if '://' in root and not (args.emit_commands and args.emit_slurm):
    raise ValueError(
      f'--root={root}: the command list and the SLURM script are written on this '
      'machine, not into a bucket: give --emit-commands=FILE and --emit-slurm=FILE '
      '(local paths)'
    )
  return (
    os.path.abspath(args.emit_commands or os.path.join(root, scripts.COMMANDS_FILE)),
    os.path.abspath(args.emit_slurm or os.path.join(root, scripts.SLURM_FILE)),
  )


def write_plan(runs, path, arg, root, files, which=(True, True), chips=()):
  """Write the command list and the SLURM script (only after every check passed); `which`: whether
  to write each; with TPU `chips`, each line starts its run on a free one of them
  (sweeps/tpu_chips.py)."""
  commands_file, slurm_file = files
  if which[0]:
    lines = [
      scripts.command_line(scripts.placed(scripts.command(r, path, arg), chips)) for r in runs
    ]
    scripts.write_text(commands_file, '\n'.join(lines) + '\n')
    print(f'commands: {commands_file}')
  if which[1]:
    name = 'sweep-' + os.path.splitext(os.path.basename(path))[0]
    scripts.write_text(slurm_file, scripts.slurm_script(commands_file, len(runs), root, name))
    print(f'slurm:    {slurm_file}  (sbatch {slurm_file})')


def write_outputs(args, runs, path, arg, root, files, declared, chips=()):
  """What the sweep writes before it launches: the study declaration into the root, the command
  list and the SLURM script next to the runs (or where --emit-* say). A dry run (--estimate too)
  writes only the files that --emit-commands, --emit-slurm and --emit-study name."""
  dry = args.dry_run or args.estimate
  study_file = args.emit_study or (
    None if dry or '://' in root else os.path.join(root, declaration.STUDY_FILE)
  )
  copy_to = scripts.join(root, declaration.STUDY_FILE)
  if declared and study_file:
    scripts.write_text(study_file, declaration.dumps(declared))
    where = os.path.abspath(study_file)
    print(
      f'study declaration: {where}'
      + (f' (copy it to {copy_to} before the runs start)' if where != copy_to else '')
    )
  elif declared:
    print(
      f'study declaration: not written (a dry run writes only what --emit-* name; '
      f'--emit-study=FILE writes it, to copy to {copy_to} before the runs start)'
    )
  which = (bool(args.emit_commands), bool(args.emit_slurm)) if dry else (True, True)
  write_plan(runs, path, arg, root, files, which, chips)


LIST_ALL, LIST_FIRST = 20, 10  # a dry run lists up to LIST_ALL commands, else the first LIST_FIRST


def list_pending(todo, path, arg, emitted):
  """A dry run's listing, below its summary line: each command still to run (`would run: ...`),
  or the first LIST_FIRST of a long list and how many more there are."""
  shown = todo if len(todo) <= LIST_ALL else todo[:LIST_FIRST]
  for run, detail in shown:
    line = scripts.command_line(scripts.command(run, path, arg))
    print(f'would run: {line}' + (f'  # {detail}' if detail else ''))
  if len(shown) < len(todo):
    where = f'all in {os.path.abspath(emitted)}' if emitted else '--emit-commands=FILE writes all'
    print(f'... and {len(todo) - len(shown)} more ({where})')


def runs_exist(root):
  """Does the (local) root hold any run (a folder with checkpoints/)?"""
  from analysis.inputs import results  # pylint: disable=import-outside-toplevel

  return os.path.isdir(root) and bool(results.find_runs(root))


def study_declaration(spec, root):
  """(declaration to write into the root or None, problem or None): a config's get_study() is
  written before the first run; once runs exist, a changed one is refused. A bucket root is not
  read here (its runs are made on other hosts): its declaration is written beside the command list."""
  declared = declaration.from_config(spec)
  path = os.path.join(root, declaration.STUDY_FILE)
  if not declared or '://' in root or not os.path.exists(path):
    return declared or None, None
  diff = declaration.differences(declaration.read_file(path), declared)
  if diff and runs_exist(root):
    return None, (
      f'{path}: get_study() differs from the declaration its runs were made under '
      f'({"; ".join(diff[:3])}); restore it, or use a new --root for a new study'
    )
  return (declared if diff else None), None


def plan(args):
  """(runs, path, arg, root, files, states, errors, declared): the sweep expanded and checked
  (see checks.check and study_declaration), files its (command list, SLURM script), declared the
  study declaration to write (None: none, or already there); raises ValueError on a bad sweep
  declaration or flags."""
  from sweeps import checks  # pylint: disable=import-outside-toplevel

  remote = '://' in args.root
  root = args.root if remote else os.path.abspath(args.root)
  if remote and not (args.dry_run or args.estimate):
    raise ValueError(
      f'--root={args.root}: bucket roots can only be emitted (add --dry-run and run '
      'the command list on the hosts); run locally with a local folder'
    )
  runs, path, arg = expand(args.config, root)
  files = output_files(args, root)
  scripts.check_commands(runs, path, arg, root, files)
  from sweeps import runner  # pylint: disable=import-outside-toplevel

  gpus = parse_gpus(args.gpus)  # a run's environment: one GPU each under --gpus (runner.py)
  errors, warnings, states = checks.check(
    runs,
    root,
    list(zip(('--emit-commands', '--emit-slurm'), files)),
    saved_state,
    runner.child_env(root, scripts.REPO, gpus[0] if gpus else None),
  )
  for line in warnings:
    print(f'warning: {line}', file=sys.stderr)
  declared, problem = study_declaration(args.config, root)
  return runs, path, arg, root, files, states, errors + ([problem] if problem else []), declared


def print_problems(errors):
  for line in errors:
    print(f'error: {line}', file=sys.stderr)
  print(
    f'error: {len(errors)} problem(s) found before launching: nothing was run or written',
    file=sys.stderr,
  )
  return 2


def pending(runs, states):
  """[(run, detail)] of the runs not completed, in order (bucket runs have no state: all are)."""
  out = []
  for run in runs:
    state, detail = states.get(run.workdir, ('todo', ''))
    if state != 'completed':
      out.append((run, detail))
  return out


def main(argv=None):
  """Run the sweep; returns the exit code (0 all completed, 1 a run failed or is in use, 2 bad
  flags or a problem found by the checks, 128 + N stopped by signal N)."""
  args = parse_args(argv)
  try:
    gpus = placement(args)
    if args.estimate_steps < 1:
      raise ValueError(f'--estimate-steps={args.estimate_steps}: give a positive number of steps')
    if not 0 < args.heartbeat < float('inf'):  # NaN fails too: it would never print
      raise ValueError(f'--heartbeat={args.heartbeat}: give a positive number of seconds')
    runs, path, arg, root, files, states, errors, declared = plan(args)
    from input_pipeline import base  # pylint: disable=import-outside-toplevel
    from sweeps import checks, runner  # pylint: disable=import-outside-toplevel

    slots, capped = checks.parallel_slots(
      args.parallel, runs, gpus, base.host_memory(), os.cpu_count() or 1
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if errors:
    return print_problems(errors)
  if capped:
    print(f'warning: {capped}', file=sys.stderr)
  todo = pending(runs, states)
  print(
    f'{len(runs)} runs ({len({r.slug for r in runs})} arms) under {root}: '
    f'{len(runs) - len(todo)} completed (skipped), {len(todo)} to run'
  )
  chips = [g for g in gpus if isinstance(g, tpu_chips.Chip)]
  write_outputs(args, runs, path, arg, root, files, declared, chips)
  if args.dry_run or args.estimate:
    list_pending(todo, path, arg, args.emit_commands)
    if chips:
      print_chip_environments(chips[:slots])
  if args.estimate and not todo:
    print('estimate: nothing to run, nothing to price')
    return 0
  if args.estimate and args.estimate_tpu:  # priced from the TPU programs compiled here
    from sweeps import tpu_estimate  # pylint: disable=import-outside-toplevel

    return tpu_estimate.price_arms(
      [r for r, _ in todo],
      lambda r: scripts.config_flags(r, path, arg),
      args.estimate_tpu,
      scripts.REPO,
      slots,
    )
  if args.estimate:  # priced: the runs still to run
    from sweeps import estimate  # pylint: disable=import-outside-toplevel

    envs = runner.slot_envs(scripts.REPO if '://' in root else root, scripts.REPO, gpus, slots)
    return estimate.measure_arms(
      [r for r, _ in todo],
      lambda r: scripts.config_flags(r, path, arg),
      envs,
      scripts.REPO,
      args.estimate_steps,
    )
  if args.dry_run:
    return 0
  return launch([r for r, _ in todo], path, arg, root, slots, gpus, len(runs), args.heartbeat)


def launch(todo, path, arg, root, slots, gpus, total, heartbeat):
  """Run the `todo` runs; print the outcome; returns main's exit code."""
  from sweeps import runner  # pylint: disable=import-outside-toplevel

  progress = runner.Progress(total, total - len(todo), slots)
  print('each run logs to <its workdir>/train.log (tail -f one to watch it)')
  progress.show()
  failures, in_use, signum = runner.run_all(
    launch_order(todo),
    lambda r: scripts.command(r, path, arg, sys.executable),
    root,
    scripts.REPO,
    progress,
    slots,
    gpus,
    lambda r: r.config.batch_size,
    heartbeat=heartbeat,
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
