"""The files a sweep writes: its command list (one `train.py` command per run, relative to the
repository root) and a SLURM job-array script whose task i runs line i of it.

Every user-supplied string (the root, the config file, override values, the emitted paths) is
shell-quoted (`shlex.quote`) where a shell reads it, and checked before anything is written: no line
breaks (the list is one run per line), and the one string SLURM reads unquoted (the `#SBATCH
--output` folder) limited to characters it cannot misread. See docs/operations.md ("Sweeps and
studies").
"""

import os
import re
import shlex
import sys

from sweeps import tpu_chips

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS_FILE = 'sweep_commands.txt'
SLURM_FILE = 'sweep.sbatch'


def join(root, *parts):  # not os.path.join: roots may be bucket paths
  return '/'.join([root.rstrip('/'), *parts])


def flag_value(value):
  """A config value as absl's --config.<field>= parses it back."""
  if isinstance(value, str):
    return value
  return repr(tuple(value) if isinstance(value, list) else value)


def config_flags(run, path, arg):
  """The run's --config flags: the file (relative to the repository root) and its overrides."""
  rel = os.path.relpath(path, REPO)
  config = rel if not rel.startswith('..') else path
  return [f'--config={config}' + (f':{arg}' if arg else '')] + [
    f'--config.{k}={flag_value(v)}' for k, v in run.overrides.items()
  ]


def command(run, path, arg, python='python'):
  """The run's train.py argv, relative to the repository root."""
  flags = config_flags(run, path, arg)
  return [python, 'train.py', flags[0], f'--workdir={run.workdir}', *flags[1:]]


def placed(argv, chips=()):
  """`argv` started on a free one of the TPU `chips` (sweeps/tpu_chips.py launcher), or as it
  is without chips."""
  return tpu_chips.launcher(chips) + list(argv) if chips else list(argv)


def command_line(argv):
  return ' '.join(shlex.quote(a) for a in argv)


# What an `#SBATCH` line may hold: SLURM reads those lines without shell quoting (a space ends the
# value, `%` starts a file-name pattern), so user paths there are limited to these characters.
SBATCH_SAFE = re.compile(r'[A-Za-z0-9._/+,:@=-]+')
LINE_BREAKS = ('\n', '\r', '\0')


def sbatch_folder(commands_file):
  """The folder of `commands_file`, for `#SBATCH --output=`; a one-line ValueError naming
  --emit-commands when SLURM could not read it safely there."""
  folder = os.path.dirname(commands_file)
  bad = sorted({c for c in folder if not SBATCH_SAFE.fullmatch(c)})
  if bad:
    raise ValueError(
      f"--emit-commands={commands_file}: its folder goes into the SLURM script's "
      f'"#SBATCH --output=" line, which SLURM reads without shell quoting, and it '
      f'holds {"".join(bad)!r}: pass --emit-commands (and --emit-slurm) in a folder '
      'named with letters, digits and ._/+,:@=- only'
    )
  return folder


def check_one_line(text, what):
  """A one-line ValueError naming `what` when `text` holds a line break (or NUL): the command list
  is one run per line, and the SLURM script runs line i of it."""
  if any(c in text for c in LINE_BREAKS):
    raise ValueError(
      f'{what}: {text!r} holds a line break, which a command list of one run per '
      'line cannot hold: remove it'
    )


def check_commands(runs, path, arg, root, files):
  """Every string that goes into the command list or the SLURM script, checked before anything is
  written: no line breaks anywhere, and an #SBATCH-safe output folder."""
  check_one_line(root, '--root')
  check_one_line(path + (arg or ''), '--config')
  for flag, file in zip(('--emit-commands', '--emit-slurm'), files, strict=True):
    check_one_line(file, flag)
  sbatch_folder(files[0])
  for i, run in enumerate(runs):
    for field, value in run.overrides.items():
      check_one_line(flag_value(value), f'get_sweep() run {i}: {field}')


def slurm_script(commands_file, count, root, job_name, python=sys.executable):
  """A job array of `count` tasks; task i runs line i (0-based) of `commands_file`, its `python`
  being the interpreter `python` (the one that wrote the script: its virtual environment, not the
  first `python` on the compute node's PATH), or $SWEEP_PYTHON where the job's environment sets it.

  Every user-supplied string is shell-quoted (shlex.quote) where the shell reads it; the one in an
  #SBATCH line (the output folder, which SLURM reads unquoted) is checked by `sbatch_folder`, and
  the job name is reduced to safe characters.
  """
  from sweeps import runner  # --help stays light

  cache_dir = runner.CACHE_DIR
  name = re.sub(r'[^A-Za-z0-9._-]+', '-', job_name).strip('-') or 'sweep'
  output = f'{sbatch_folder(commands_file)}/slurm-%A_%a.out'
  return '\n'.join(
    [
      '#!/bin/bash',
      f'#SBATCH --job-name={name}',
      f'#SBATCH --array=0-{count - 1}',
      f'#SBATCH --output={output}',
      '#SBATCH --ntasks=1',
      '# Add resource lines, e.g. #SBATCH --gres=gpu:1. Task i runs line i (0-based) of the list;',
      '# completed runs return at once, unfinished ones resume from their latest checkpoint.',
      'set -euo pipefail',
      f'cd {shlex.quote(REPO)}',
      f'CACHE_DEFAULT={shlex.quote(join(root, cache_dir))}',
      'export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$CACHE_DEFAULT}"',
      f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands_file)})',
      f'PYTHON={shlex.quote(python)}',
      'PYTHON="${SWEEP_PYTHON:-$PYTHON}"',
      'python() { "$PYTHON" "$@"; }  # the lines\' `python`: the interpreter that wrote them',
      'echo "task $SLURM_ARRAY_TASK_ID: $PYTHON ${CMD#python }"',
      'eval "$CMD"',
      '',
    ]
  )


def write_text(path, text):
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)
