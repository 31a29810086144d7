"""A whole study in one command: the sweep, the statistics report, the figures.

  python -m sweeps.study --config=configs/digits.py:study --root=/tmp/study --parallel 2

Runs `python -m sweeps.sweep` (arms x seeds of the config's get_sweep(); finished runs are
skipped, so the command resumes), then the analysis.stats report of every run under the root
(Markdown on stdout and in ROOT/report.md, also ROOT/report.tex and ROOT/report_<table>.csv), then
the analysis.figures PDFs and PNGs into ROOT/figures. Runs that failed are excluded from the report
and listed in it; the exit code is then 1.

If the config file defines `get_study(arg=None)` returning a dict (keys, each optional: margin,
margin_reason, factors, reference, noise_arm, native, platform_profile), analysis.attribution then
runs with those settings (factors default: platform and the requested numerics fields that vary;
margin default: --margin) and writes ROOT/attribution.csv, ROOT/attribution.md (printed too),
ROOT/attribution_gap.csv when there is a platform gap, and ROOT/figures/attribution_forest.{pdf,png}.
"""

import argparse
import os
import sys
import time

from analysis import attribution, effects, figures, results, stats
from sweeps import runner, sweep
from analysis import report as report_text
from configs import loader


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m sweeps.study', description=__doc__.split('\n')[0])
  sweep.add_run_args(p, 'configs/digits.py:study',
                     'local folder for the runs, the report and figures/')
  p.add_argument('--group-by', nargs='+', default=[], help='columns defining an arm (analysis.stats)')
  p.add_argument('--metric', default=stats.DEFAULT_METRIC,
                 help=f'the column compared between arms (default {stats.DEFAULT_METRIC})')
  p.add_argument('--margin', type=float, default=None,
                 help="equivalence margin, pp (default: the config's get_study() declaration)")
  p.add_argument('--margin-reason', default=None, help='why --margin (printed in the report)')
  return p.parse_args(argv)


def sweep_argv(args):
  argv = [f'--config={args.config}', f'--root={args.root}']
  if args.parallel:
    argv.append(f'--parallel={args.parallel}')
  if args.gpus:
    argv.append(f'--gpus={args.gpus}')
  return argv


def declaration(config):
  """The study's declaration: the config file's get_study(arg) dict ({} without one)."""
  if not config:
    return {}
  path, arg = loader.split_spec(config)
  module = loader.load_module(path)
  settings = module.get_study(arg or None) if hasattr(module, 'get_study') else {}
  if not isinstance(settings, dict):
    raise ValueError(f'{path}: get_study() must return a dict (margin, factors, reference, ...)')
  return settings


def report(root, group_by, metric, margin=None, config=None, margin_reason=None):
  """Write ROOT/report.{md,tex}, ROOT/report_*.csv and ROOT/figures; print the Markdown; then the
  attribution when the config declares a study (get_study)."""
  settings = declaration(config)
  margin, why = stats.margin_choice(margin, margin_reason, settings.get('margin'),
                                    settings.get('margin_reason'))
  runs, hist = results.load(root)
  out = stats.analyse(runs, group_by, metric, margin, why)
  out['source'] = root
  report_text.write_report(out, 'md')
  report_text.write_report(out, 'md', os.path.join(root, 'report.md'))
  report_text.write_report(out, 'latex', os.path.join(root, 'report.tex'))
  report_text.write_report(out, 'csv', os.path.join(root, 'report.csv'))
  written = figures.make_all(out, hist, os.path.join(root, 'figures'))
  if settings:
    written += attribution_report(root, runs, settings, metric, margin, why)
  return written


def platform_profile(runs, declared):
  """The declared {platform: profile} for the platforms among the completed runs: a study's
  declaration lists every platform it may run on (analysis.attribution rejects one without runs)."""
  completed = runs[runs['status'] == 'completed']
  present = set(completed['platform'].astype(str)) if 'platform' in runs else set()
  given = effects.parse_pairs(declared, '--platform-profile')
  return {p: level for p, level in given.items() if p in present}


def attribution_report(root, runs, settings, metric, margin, margin_reason):
  """analysis.attribution with the study's declared factors, reference levels and controls."""
  out = attribution.run(
      runs, settings.get('factors') or attribution.default_factors(runs), metric=metric,
      reference=settings.get('reference'), margin=margin, noise_arm=settings.get('noise_arm'),
      native=settings.get('native'),
      platform_profile=platform_profile(runs, settings.get('platform_profile')),
      source=root, margin_reason=margin_reason)
  print(f'\n{out["text"]}', flush=True)
  return attribution.write(out, root, os.path.join(root, 'figures'))


def main(argv=None):
  args = parse_args(argv)
  if '://' in args.root:
    print(f'error: --root={args.root}: a study runs locally; for bucket roots use '
          'python -m sweeps.sweep --dry-run, then analysis.stats / analysis.figures --runs=',
          file=sys.stderr)
    return 2
  start = time.time()
  code = sweep.main(sweep_argv(args))
  if code == 2 or code >= 128:  # bad input found before any run, or stopped by a signal
    return code
  print(f'\nreport (also in {os.path.join(os.path.abspath(args.root), "report.md")}):\n', flush=True)
  try:
    written = report(os.path.abspath(args.root), args.group_by, args.metric, args.margin,
                     args.config, args.margin_reason)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('\nfigures:\n' + '\n'.join(f'  {p}' for p in written))
  load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
  print(f'study finished in {runner.fmt_duration(time.time() - start)} (load average {load})'
        + ('; some runs failed: see above' if code else ''))
  return code


if __name__ == '__main__':
  sys.exit(main())
