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

import argparse
import collections
import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from configs import common, loader
from runrecord import sessions
from sweeps import scripts, sweep_args, sweep_outputs, tpu_chips

if TYPE_CHECKING:
  import ml_collections

# The modules that start JAX, pandas or the runner (sweeps.checks, claims, runner, estimate,
# tpu_estimate), and configs.validation and input_pipeline.base (numpy), are imported where they
# are used: --help and a bad flag are answered before any of them loads.


# config: get_config(arg) with the run's overrides, resolved (configs/validation.py); as
# written when it does not resolve, `problem` then saying why in one line (None: runs built by
# hand).
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


def arm_slug(arm: Mapping[str, Any], leaves: Iterable[str]) -> str:
  """'profile-tpu-default_compute_dtype-bfloat16': fields in the arm's order, from the arm alone
  (stable when arms are added or removed); 'default' for an arm without overrides."""
  parts = [f'{short_name(k, leaves)}-{slug_value(v)}' for k, v in arm.items()]
  return '_'.join(parts) or 'default'


def check_overrides(
  module: ModuleType, arg: str, overrides: Mapping[str, Any], index: int
) -> 'ml_collections.ConfigDict':
  """Apply the run's overrides to the config (one-line error naming the field); returns it."""
  config = module.get_config(arg)
  try:
    return common.apply_overrides(config, overrides.items())
  except ValueError as e:
    raise ValueError(f'get_sweep() run {index}: {e}; use a dotted field of get_config()') from None


def expand(spec: str, root: str) -> tuple[list[Run], str, str]:
  """(runs, config file, arg): the sweep of `spec` ('FILE[:ARG]', the config file's get_sweep(arg))
  with one workdir per run under `root`, each run with its config; one-line ValueError on a bad
  sweep declaration."""
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
  runs, seen = [], set()
  slugs: dict[str, dict] = {}
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
  from configs import validation

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
  from sweeps import claims

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


def launch_order(runs: Iterable[Run]) -> list[Run]:
  """Round-robin over arms (each arm's first seed, then each arm's second, ...): runs started
  together compile different arms, and later seeds of an arm find its compiles in the cache."""
  arms = list(dict.fromkeys(r.slug for r in runs))
  rank = {id(r): i for arm in arms for i, r in enumerate(x for x in runs if x.slug == arm)}
  return sorted(runs, key=lambda r: (rank[id(r)], arms.index(r.slug)))


def print_chip_environments(chips):
  """What each run gets on each chip (a run takes the first free chip): libtpu's variables."""
  print('each run takes a free TPU chip and runs with its variables (sweeps/tpu_chips.py):')
  for chip in chips:
    print(f'  {chip}: {tpu_chips.settings(tpu_chips.environment(chip.index))}')


class Plan(NamedTuple):
  """What plan returns: the sweep's runs and what was found about them."""

  runs: list[Run]
  path: str  # the config file
  arg: str  # its arg (presets and overrides)
  root: str  # absolute, unless a bucket
  files: tuple[str, str]  # (command list, SLURM script)
  states: dict[str, tuple[str, str]]  # {run folder: (saved state, detail)}, checks.check's
  errors: list[str]  # the problems found, one line each
  declared: dict | None  # the study declaration to write (None: none, or there already)


def plan(args: argparse.Namespace) -> Plan:
  """The sweep expanded and checked (checks.check, sweep_outputs.study_declaration); raises
  ValueError on a bad sweep declaration or flags."""
  from sweeps import checks

  remote = '://' in args.root
  root = args.root if remote else os.path.abspath(args.root)
  if remote and not (args.dry_run or args.estimate):
    raise ValueError(
      f'--root={args.root}: bucket roots can only be emitted (add --dry-run and run '
      'the command list on the hosts); run locally with a local folder'
    )
  runs, path, arg = expand(args.config, root)
  files = sweep_outputs.output_files(args, root)
  scripts.check_commands(runs, path, arg, root, files)
  from sweeps import runner

  gpus = sweep_args.parse_gpus(
    args.gpus
  )  # a run's environment: one GPU each under --gpus (runner.py)
  errors, warnings, states = checks.check(
    runs,
    root,
    list(zip(('--emit-commands', '--emit-slurm'), files, strict=True)),
    saved_state,
    runner.child_env(root, scripts.REPO, gpus[0] if gpus else None),
  )
  for line in warnings:
    print(f'warning: {line}', file=sys.stderr)
  declared, problem = sweep_outputs.study_declaration(args.config, root)
  return Plan(
    runs, path, arg, root, files, states, errors + ([problem] if problem else []), declared
  )


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


def main(argv: Sequence[str] | None = None) -> int:
  """Run the sweep; returns the exit code (0 all completed, 1 a run failed or is in use, 2 bad
  flags or a problem found by the checks, 128 + N stopped by signal N)."""
  args = sweep_args.parse_args(argv)
  try:
    gpus = sweep_args.placement(args)
    if args.estimate_steps < 1:
      raise ValueError(f'--estimate-steps={args.estimate_steps}: give a positive number of steps')
    if not 0 < args.heartbeat < float('inf'):  # NaN fails too: it would never print
      raise ValueError(f'--heartbeat={args.heartbeat}: give a positive number of seconds')
    runs, path, arg, root, files, states, errors, declared = plan(args)
    from input_pipeline import base
    from sweeps import checks, runner

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
  sweep_outputs.write_outputs(args, runs, path, arg, root, files, declared, chips)
  if args.dry_run or args.estimate:
    sweep_outputs.list_pending(todo, path, arg, args.emit_commands)
    if chips:
      print_chip_environments(chips[:slots])
  if args.estimate and not todo:
    print('estimate: nothing to run, nothing to price')
    return 0
  if args.estimate and args.estimate_tpu:  # priced from the TPU programs compiled here
    from sweeps import tpu_estimate

    return tpu_estimate.price_arms(
      [r for r, _ in todo],
      lambda r: scripts.config_flags(r, path, arg),
      args.estimate_tpu,
      scripts.REPO,
      slots,
    )
  if args.estimate:  # priced: the runs still to run
    from sweeps import estimate

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


def launch(
  todo: Sequence[Run],
  path: str,
  arg: str,
  root: str,
  slots: int,
  gpus: Sequence[int | tpu_chips.Chip],
  total: int,
  heartbeat: float,
) -> int:
  """Run the `todo` runs; print the outcome; returns main's exit code."""
  from sweeps import runner

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
