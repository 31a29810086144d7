"""The statistics report and the attribution (python -m analysis.analyse, analysis.attribute) on
synthetic run tables of 10^3 to 10^5 rows in analysis.export's own format: seconds and peak memory.

  python -m benchmarks.bench_analysis --sizes 1000 100000 --max-memory-gb 4

Each measurement runs in its own subprocess under an address-space limit. Reference:
docs/performance.md.
"""

import argparse
import functools
import importlib
import json
import math
import os
import platform as platform_lib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from runrecord import record

# pandas and the analysis load where a table is made or read: --help is answered without them.

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


def runs_table(seeds, rng=0, seed_sd=SEED_SD):
  """4 arms x `seeds` runs: run, platform, profile, seed, accuracy: 70 % + the arm's effect + a
  seed effect (sd `seed_sd` pp, shared by the arms) + run noise (sd 0.3 pp), as a fraction rounded
  to 1/10,000 (a 10,000-image test set: ties, as real accuracies have them)."""
  import pandas as pd

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
  """runs_table(seeds) as analysis.export writes it: `template`'s first run per platform."""
  import pandas as pd

  runs = runs_table(seeds, rng, seed_sd)
  source = pd.read_csv(template)
  first = source.groupby('platform', sort=False).head(1).set_index('platform')
  first.loc['tpu'] = first.loc['cpu']
  table = first.loc[runs['platform']].reset_index()
  table['run'] = runs['run'].to_numpy()
  for column in ('seed', 'config.seed'):
    table[column] = runs['seed'].to_numpy()
  for column in ('numerics.requested', 'numerics.effective', 'config.numerics'):
    table[f'{column}.profile'] = runs['profile'].to_numpy()
  table['numerics.effective.platform'] = table['platform']
  table[record.DEFAULT_METRIC] = runs['accuracy'].to_numpy()
  return table[source.columns]


# What run_tool imports (measure loads them before it starts the clock).
RUN_TOOL_MODULES = ('inputs', 'analyse', 'agreement', 'attribution', 'report')  # analysis.*


def run_tool(tool, path):
  """Run `tool` on the CSV at `path` as its command line would; the method it names."""
  from analysis import analyse, attribution, inputs, report

  frame = inputs.read_csv(path, record.DEFAULT_METRIC, 'seed', FACTORS)
  if tool == 'stats':  # what `python -m analysis.analyse --csv` does, every pair compared
    out = analyse.study_analysis(frame, {}, FACTORS, record.DEFAULT_METRIC, margin=0.3)
    report.render(out, 'md')
    pairs = out.pairs
    used = pairs['signed_rank_method'].where(pairs['paired'], pairs['mw_method'])
    return 'rank test: ' + ', '.join(sorted(set(used)))
  out = attribution.factor_attribution(frame, FACTORS, record.DEFAULT_METRIC, margin=0.3)
  model, _, why = out.method.partition(' (')  # why: after the model's own parentheses
  why = why.split('df); ', 1)[1].split(' (')[0] if 'df); ' in why else ''
  return f'{model}; {why}' if why else model


def measure(tool, path):
  """The child: one JSON line with seconds, peak RSS and the tool's method, timed after imports."""
  for module in RUN_TOOL_MODULES:
    importlib.import_module(f'analysis.{module}')
  after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  start = time.perf_counter()
  method = run_tool(tool, path)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  seconds = time.perf_counter() - start
  print(json.dumps(dict(seconds=seconds, method=method, peak_mb=peak, imports_mb=after_imports)))


def child(tool, path, max_gb, timeout):
  """Run measure() in a subprocess under an address-space limit; its result or why it failed."""
  hard = resource.getrlimit(resource.RLIMIT_AS)[1]
  limit = int(max_gb * 1024**3)
  limit = limit if hard == resource.RLIM_INFINITY else min(hard, limit)
  cap = functools.partial(resource.setrlimit, resource.RLIMIT_AS, (limit, hard))
  cmd = [sys.executable, '-m', 'benchmarks.bench_analysis', '--measure', tool, '--csv', path]
  env, start = {**os.environ, 'PYTHONPATH': ROOT}, time.perf_counter()
  try:
    kwargs = dict(cwd=ROOT, env=env, capture_output=True, text=True, preexec_fn=cap, check=False)
    done = subprocess.run(cmd, timeout=timeout, **kwargs)
  except subprocess.TimeoutExpired:
    return {'failed': f'not done after {timeout} s'}
  if done.returncode:
    sys.stderr.write(done.stderr)  # the child's traceback, whole
    last = (done.stderr.strip().splitlines() or ['?'])[-1]
    seconds = time.perf_counter() - start
    return {'failed': f'exit {done.returncode} after {seconds:.0f} s: {last[:80]}'}
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
  p = common.parser('bench_analysis', __doc__)
  sizes = [1_000, 10_000, 100_000]
  p.add_argument('--sizes', type=int, nargs='+', default=sizes, help='rows: 4 arms x seeds')
  p.add_argument('--tools', nargs='+', choices=TOOLS, default=list(TOOLS), help='what is measured')
  p.add_argument('--seed-sd', type=float, default=SEED_SD, help='sd of the seed effect, pp')
  p.add_argument('--max-memory-gb', type=float, default=8.0, help='address-space limit, GB')
  p.add_argument('--timeout', type=int, default=600, help='seconds per measurement')
  p.add_argument('--measure', choices=TOOLS, help=argparse.SUPPRESS)  # the child's side
  p.add_argument('--csv', help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  bad = [n for n in args.sizes if n < 8 or n % len(ARMS)]
  if bad:
    common.fail(f'--sizes: {bad[0]} is not a multiple of 4 (>= 8); give rows = 4 arms x seeds')
  if not args.seed_sd >= 0:
    common.fail(f'--seed-sd: {args.seed_sd} must be a non-negative sd in pp')
  if not args.max_memory_gb > 0:
    common.fail(f'--max-memory-gb: {args.max_memory_gb} must be positive')
  if args.measure:
    measure(args.measure, args.csv)
    return
  import pandas as pd
  import scipy
  import statsmodels

  versions = ', '.join(f'{m.__name__} {m.__version__}' for m in (np, pd, scipy, statsmodels))
  first = f'python {platform_lib.python_version()}, {versions}'
  common.command_line('bench_analysis', argv, f'{first} | {common.host()}')
  rows, worst = [], {'seconds': 0.0, 'peak_mb': 0.0}
  with tempfile.TemporaryDirectory(prefix='bench_analysis_') as tmp:
    for n in args.sizes:
      path = os.path.join(tmp, f'runs_{n}.csv')
      export_table(n // len(ARMS), seed_sd=args.seed_sd).to_csv(path, index=False)
      for tool in args.tools:
        r = child(tool, path, args.max_memory_gb, args.timeout)
        row = [f'{n:,}', f'{len(ARMS)} x {n // len(ARMS):,}', tool]
        if 'failed' in r:
          rows.append(row + ['–', '–', '–', f'failed: {r["failed"]}'])
          worst['seconds'] = math.inf
          continue
        memory = [f'{r["peak_mb"]:.0f}', f'{r["imports_mb"]:.0f}']
        rows.append(row + [f'{r["seconds"]:.1f}', *memory, r['method']])
        worst = {k: max(worst[k], r[k]) for k in worst}
  header = ['rows', 'arms x seeds', 'tool', 'seconds', 'peak RSS (MB)', 'after imports (MB)']
  line = f'max_seconds={worst["seconds"]:.1f} max_peak_mb={worst["peak_mb"]:.0f}'
  common.report('', [*header, 'method'], rows, line)


if __name__ == '__main__':
  main()
