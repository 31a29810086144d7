"""The README says exactly what was measured: what the shipped study is and is not, that no TPU run
exists, the identity's terms where the findings use them, the GPU install that produced
results/, and which host reproduces the CPU records. Each check reads the number it expects from
its source (configs/digits.py, the shipped CSV, requirements-gpu.txt), not from the README.
"""

import csv
import os
import re

from analysis import findings
from configs import digits
from tests.conftest import ROOT

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
FIRST_SCREEN = 30  # lines: what a reader sees before scrolling


def read(*path):
  with open(os.path.join(ROOT, *path), encoding='utf-8') as f:
    return f.read()


def flat(text):
  return ' '.join(text.split())


def test_the_first_screen_says_what_the_study_is_what_it_is_not_and_that_no_tpu_run_exists():
  screen = flat('\n'.join(read('README.md').splitlines()[:FIRST_SCREEN]))
  config = digits.get_config('study')
  size = config.data.image_size
  assert 'No TPU run exists yet' in screen
  assert f'width-{config.model.width:g} ResNet-18' in screen
  assert f'{config.num_epochs} epochs' in screen and f'{size}×{size} digits' in screen
  with open(CSV, newline='', encoding='utf-8') as f:
    seeds = {r['seed'] for r in csv.DictReader(f)}
  assert f'× {len(seeds)} seeds' in screen  # the shipped export's seeds per arm
  assert 'pipeline demonstration, not a claim' in screen
  assert f'±{digits.MARGIN_PP:g} pp' in screen
  assert flat(digits.MARGIN_REASON.split('; ', 1)[1]) in screen  # the declaration's own reason


def test_the_identitys_terms_are_defined_above_the_findings_that_use_them():
  readme = read('README.md')
  section = readme[readme.index('## Reading the findings') : readme.index(findings.FIRST)]
  generated = readme[readme.index(findings.FIRST) : readme.index(findings.LAST)]
  identity = re.search(r'G = (\S+) − (\S+) \+ N \+ P', generated)
  assert identity and identity.groups() == ('fid_A', 'fid_B'), 'the generated identity changed'
  for term in (
    '**G**',
    '**fid_X**',
    '**N**',
    '**P**',
    '**R**',
    '**Share (Fieller)**',
    '**contrasts (Holm)**',
  ):
    assert term in section, term
  assert '(docs/statistics.md#the-gap-decomposition)' in section
  assert 'on the digits study only' in section  # the study, named just above the generated block


def pins(path):
  """{package: version} of a requirements file (extras dropped, lower case)."""
  out = {}
  for line in read(path).splitlines():
    match = re.match(r'^([A-Za-z0-9_.-]+)(\[[^]]*\])?==(\S+)', line)
    if match:
      out[match.group(1).lower().replace('_', '-')] = match.group(3)
  return out


def test_the_gpu_install_pins_the_versions_of_the_shipped_h100_runs():
  with open(CSV, newline='', encoding='utf-8') as f:
    gpu = [r for r in csv.DictReader(f) if r['platform'] == 'gpu']
  pinned = pins('requirements-gpu.txt')
  for package in ('jax', 'jaxlib', 'flax', 'optax', 'numpy', 'orbax-checkpoint'):
    recorded = {r[f'versions.{package}'] for r in gpu}
    assert recorded == {pinned[package]}, package
  gpu_block = read('README.md').split('# NVIDIA GPU', 1)[1].split('python train.py', 1)[0]
  assert 'pip install -r requirements-gpu.txt' in gpu_block and 'python3.12' in gpu_block
  assert '0.10.2' not in gpu_block  # the CPU's jax, which the H100 runs did not use


def test_the_cpu_reproduction_claim_names_the_host_and_what_was_measured():
  """The shipped CPU records came from an AMD EPYC AVX-512 host; no ISA alone reproduces them
  (an Intel AVX512_VNNI host differed in 38 of 48 final accuracies): README and results/README
  name the host and the measured comparison, and claim no reproduction by instruction set."""
  for name in (('README.md',), ('results', 'README.md')):
    text = flat(read(*name))
    assert 'AMD EPYC' in text and 'AVX512_BF16' in text, name
    assert 'AVX512_VNNI' in text and '38 of 48' in text, name
    assert not re.search(
      r'AVX-512 host (its final metrics equalled|reproduced their final '
      r'metrics)',
      text,
    ), name
