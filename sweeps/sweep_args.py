"""sweeps.sweep's command line: the flags of running a sweep (add_run_args, which sweeps.run_study
shares), all of its flags parsed (parse_args), and the devices its slots get (placement).
"""

import argparse
from collections.abc import Sequence

from analysis import cli
from sweeps import scripts, tpu_chips


def parse_gpus(text: str) -> list[int]:
  try:
    return [int(g) for g in text.split(',') if g.strip()]
  except ValueError:
    raise ValueError(f'--gpus={text}: give comma-separated GPU ids, e.g. --gpus 0,1,2,3') from None


def placement(args: argparse.Namespace) -> list[int] | list[tpu_chips.Chip]:
  """The slots' devices: the GPU ids of --gpus, or the TPU chips of --tpu-chips
  (tpu_chips.Chip), never both; one-line ValueError otherwise."""
  gpus, chips = parse_gpus(args.gpus), tpu_chips.parse(args.tpu_chips)
  if gpus and chips:
    raise ValueError('--gpus and --tpu-chips: give one of them (a run uses GPUs or a TPU chip)')
  if getattr(args, 'estimate_tpu', '') and not getattr(args, 'estimate', False):
    raise ValueError('--estimate-tpu prices the runs: give it with --estimate')
  return gpus or chips


def add_run_args(p: argparse.ArgumentParser, example_config: str, root_help: str) -> None:
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
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
