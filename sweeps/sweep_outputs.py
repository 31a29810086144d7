"""What a sweep writes before it launches (sweeps/sweep.py): the study declaration into the root,
the command list and the SLURM script next to the runs (or where --emit-* say), and a dry run's
listing of the commands still to run.
"""

import os

from analysis.inputs import declaration
from sweeps import scripts


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
  from analysis.inputs import results

  return os.path.isdir(root) and bool(results.find_runs(root))


def study_declaration(spec, root):
  """(declaration to write into the root or None, problem or None): a config's get_study() is
  written before the first run; once runs exist, a changed one is refused. A bucket root is not
  read here (its runs are made on other hosts): its declaration is written beside the command
  list."""
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
