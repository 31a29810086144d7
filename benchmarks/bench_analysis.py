"""The statistics report and the attribution (python -m analysis.analyse /
analysis.numbers.attribution) on synthetic run tables of 10^3 to 10^5 rows in analysis.export's own
105-column format.

  python -m benchmarks.bench_analysis                        # 1,000, 10,000 and 100,000 rows
  python -m benchmarks.bench_analysis --sizes 1000 100000 --max-memory-gb 4

The table (runs_table): 4 arms x N seeds, one row per run, as a published CSV would have them
(run, platform, profile, seed, accuracy): gpu/native, tpu/native, gpu/tpu_default and
gpu/jax_gpu_default, so the attribution fits both its models (the factor effects and the
platform-gap decomposition). Accuracy = 70 % + the arm's effect + a seed effect (sd --seed-sd,
0.7 pp, shared by the arms) + run noise (sd 0.3 pp), as a fraction rounded to 1/10,000 (a
10,000-image test set: ties, as real accuracies have them). The CSV the tools read
(export_table) has those runs in the format python -m analysis.export writes (TEMPLATE's 105
columns: config, numerics, data, versions, ...; profile = numerics.requested.profile, accuracy =
final.test_accuracy), so its memory is what an exported study costs.

Each tool and size runs in its own subprocess (`--measure TOOL --csv FILE`), under an
address-space limit of --max-memory-gb (a tool that needs more fails with MemoryError instead of
taking the machine down). What is timed, after the imports: stats = csv_input.read_csv (the
columns the analysis uses, checked) + answer.study_analysis (every pair compared: no
declaration) + the Markdown report, what `python -m analysis.analyse --csv` computes; attribution =
read_csv + attribution.factor_attribution (effects, gap decomposition; no files). Peak memory =
the subprocess's peak resident set (getrusage ru_maxrss: the 'Maximum resident set size' of
/usr/bin/time -v), the interpreter and its imports included (their share is the 'after imports'
column).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import importlib
import json
import os
import platform as platform_lib
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = (
  ('gpu', 'native', 0.0),
  ('tpu', 'native', 0.3),
  ('gpu', 'tpu_default', 0.3),
  ('gpu', 'jax_gpu_default', 0.0),
)  # platform, profile, effect in pp
SEED_SD, RUN_SD, BASE, TEST_IMAGES = 0.7, 0.3, 70.0, 10_000
TOOLS = ('stats', 'attribution')
# An exported study (python -m analysis.export): the format the tables are generated in.
TEMPLATE = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
FACTORS = ['platform', 'profile']


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_analysis', description=common.description(__doc__)
  )
  p.add_argument(
    '--sizes',
    type=int,
    nargs='+',
    default=[1_000, 10_000, 100_000],
    help='rows per table (a multiple of 4: 4 arms x rows/4 seeds)',
  )
  p.add_argument(
    '--tools', nargs='+', choices=TOOLS, default=list(TOOLS), help='what is measured (default both)'
  )
  p.add_argument(
    '--seed-sd',
    type=float,
    default=SEED_SD,
    help='sd of the seed effect, pp (0: MixedLM fits a boundary and the attribution '
    'falls back to seed fixed effects)',
  )
  p.add_argument(
    '--max-memory-gb',
    type=float,
    default=8.0,
    help='address-space limit of each measurement subprocess',
  )
  p.add_argument('--timeout', type=int, default=600, help='seconds per measurement subprocess')
  p.add_argument(
    '--mixed-max-rows',
    type=int,
    default=None,
    help='override analysis.numbers.effects.MIXED_MAX_ROWS (what MixedLM would cost beyond it)',
  )
  p.add_argument('--measure', choices=TOOLS, help=argparse.SUPPRESS)
  p.add_argument('--csv', help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  bad = [n for n in args.sizes if n < 8 or n % len(ARMS)]
  if bad:
    common.fail(
      f'--sizes: {bad[0]} is not a multiple of {len(ARMS)} (>= 8); give rows = '
      f'{len(ARMS)} arms x seeds'
    )
  if not args.seed_sd >= 0:
    common.fail(f'--seed-sd: {args.seed_sd} must be a non-negative sd in pp')
  if not args.max_memory_gb > 0:
    common.fail(f'--max-memory-gb: {args.max_memory_gb} must be positive')
  return args


if __name__ == '__main__':  # --help and a bad flag before the imports below load pandas
  parse_args(sys.argv[1:])

import numpy as np
import pandas as pd

from runrecord import record


def runs_table(seeds, rng=0, seed_sd=SEED_SD):
  """4 arms x `seeds` runs: run, platform, profile, seed, accuracy (a fraction; see the module
  doc)."""
  rng = np.random.default_rng(rng)
  seed_effect = rng.normal(0, seed_sd, seeds)
  parts = [
    pd.DataFrame(
      {
        'run': [f'{platform}/{profile}/{s}' for s in range(seeds)],
        'platform': platform,
        'profile': profile,
        'seed': np.arange(seeds),
        'accuracy': BASE + effect + seed_effect + rng.normal(0, RUN_SD, seeds),
      }
    )
    for platform, profile, effect in ARMS
  ]
  table = pd.concat(parts, ignore_index=True)
  table['accuracy'] = np.round(table['accuracy'] / 100 * TEST_IMAGES) / TEST_IMAGES
  return table


def export_table(seeds, rng=0, seed_sd=SEED_SD, template=TEMPLATE):
  """runs_table(seeds) in analysis.export's own format (the 105 columns of `template`, an exported
  study): each run is a copy of the template's first run of its platform (tpu: of its cpu run,
  renamed) with its own run id, seed, profile and accuracy (final.test_accuracy)."""
  runs = runs_table(seeds, rng, seed_sd)
  source = pd.read_csv(template)
  first = source.groupby('platform', sort=False).head(1).set_index('platform')
  first.loc['tpu'] = first.loc['cpu']
  table = first.loc[runs['platform']].reset_index()
  table['run'] = runs['run'].to_numpy()
  for column in ('seed', 'config.seed'):
    table[column] = runs['seed'].to_numpy()
  for column in (
    'numerics.requested.profile',
    'config.numerics.profile',
    'numerics.effective.profile',
  ):
    table[column] = runs['profile'].to_numpy()
  table['numerics.effective.platform'] = table['platform']
  table[record.DEFAULT_METRIC] = runs['accuracy'].to_numpy()
  return table[source.columns]


# What run_tool imports (measure loads them before it starts the clock).
RUN_TOOL_MODULES = (
  'analysis.inputs.csv_input',
  'analysis.numbers.answer',
  'analysis.numbers.attribution',
  'analysis.words.report',
)


def run_tool(tool, path):
  """Run `tool` on the CSV at `path` (export_table's format) as its command line would; returns
  the method it names."""
  from analysis.inputs import csv_input
  from analysis.numbers import answer, attribution
  from analysis.words import report

  frame = csv_input.read_csv(path, record.DEFAULT_METRIC, 'seed', FACTORS)
  if tool == 'stats':  # what `python -m analysis.analyse --csv` does, every pair compared
    out = answer.study_analysis(frame, {}, FACTORS, record.DEFAULT_METRIC, margin=0.3)
    report.render(out, 'md')
    pairs = out.pairs
    used = pairs['signed_rank_method'].where(pairs['paired'], pairs['mw_method'])
    return 'rank test: ' + ', '.join(sorted(set(used)))
  out = attribution.factor_attribution(frame, FACTORS, record.DEFAULT_METRIC, margin=0.3)
  model, _, why = out.method.partition(' (')  # why: after the model's own parentheses
  why = why.split('df); ', 1)[1].split(' (')[0] if 'df); ' in why else ''
  return f'{model}; {why}' if why else model


def measure(tool, path, mixed_max_rows=None):
  """The child: one JSON line with seconds, peak RSS and the method the tool reports; every module
  run_tool imports is imported here, before the clock starts."""
  for module in RUN_TOOL_MODULES:
    importlib.import_module(module)
  from analysis.numbers import effects

  if mixed_max_rows:  # measure MixedLM beyond the size where the attribution stops fitting it
    effects.MIXED_MAX_ROWS = mixed_max_rows
  after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  start = time.perf_counter()
  method = run_tool(tool, path)
  print(
    json.dumps(
      {
        'seconds': time.perf_counter() - start,
        'method': method,
        'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        'imports_mb': after_imports,
      }
    )
  )


def child(tool, path, max_gb, timeout, mixed_max_rows=None):
  """Run measure() in a subprocess under an address-space limit; its result or why it failed."""
  hard = resource.getrlimit(resource.RLIMIT_AS)[1]
  limit = int(max_gb * 1024**3)
  limit = limit if hard == resource.RLIM_INFINITY else min(hard, limit)

  def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

  cmd = [sys.executable, '-m', 'benchmarks.bench_analysis', '--measure', tool, '--csv', path]
  cmd += ['--mixed-max-rows', str(mixed_max_rows)] if mixed_max_rows else []
  env = {**os.environ, 'PYTHONPATH': ROOT}
  start = time.perf_counter()
  try:
    done = subprocess.run(
      cmd,
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
      preexec_fn=cap,
      check=False,
    )
  except subprocess.TimeoutExpired:
    return {'failed': f'not done after {timeout} s'}
  if done.returncode:
    last = (done.stderr.strip().splitlines() or ['?'])[-1]
    seconds = time.perf_counter() - start
    return {'failed': f'exit {done.returncode} after {seconds:.0f} s: {last[:80]}'}
  return json.loads(done.stdout.strip().splitlines()[-1])


def versions():
  """The analysis stack's versions, the host, the date and the load (one line for the record)."""
  import scipy
  import statsmodels

  return (
    f'python {platform_lib.python_version()}, numpy {np.__version__}, pandas '
    f'{pd.__version__}, scipy {scipy.__version__}, statsmodels {statsmodels.__version__} | '
    + common.host()
  )


def main(argv=None):
  args = parse_args(argv)
  if args.measure:
    measure(args.measure, args.csv, args.mixed_max_rows)
    return
  print(versions())
  print(common.command_line('bench_analysis', argv))
  rows = [
    '| rows | arms x seeds | tool | seconds | peak RSS (MB) | after imports (MB) | method |',
    '|---|---|---|---|---|---|---|',
  ]
  worst = {'seconds': 0.0, 'peak_mb': 0.0}
  with tempfile.TemporaryDirectory(prefix='bench_analysis_') as tmp:
    for n in args.sizes:
      path = os.path.join(tmp, f'runs_{n}.csv')
      export_table(n // len(ARMS), seed_sd=args.seed_sd).to_csv(path, index=False)
      for tool in args.tools:
        r = child(tool, path, args.max_memory_gb, args.timeout, args.mixed_max_rows)
        shape = f'{len(ARMS)} x {n // len(ARMS):,}'
        if 'failed' in r:
          rows.append(f'| {n:,} | {shape} | {tool} | – | – | – | failed: {r["failed"]} |')
          worst['seconds'] = np.inf
          continue
        rows.append(
          f'| {n:,} | {shape} | {tool} | {r["seconds"]:.1f} | {r["peak_mb"]:.0f} | '
          f'{r["imports_mb"]:.0f} | {r["method"]} |'
        )
        worst = {k: max(worst[k], r[k]) for k in worst}
  print('\n'.join(rows))
  print(f'max_seconds={worst["seconds"]:.1f} max_peak_mb={worst["peak_mb"]:.0f}')


if __name__ == '__main__':
  main()
