"""The study's answer (analysis.analyse -> analysis.report): the one-page answer first
(question, platforms and software with version differences flagged, decomposition, contrasts),
report.tex as booktabs tables, and several roots (local folders here) giving the tables of one root
holding them all."""

import os

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, attribution, inputs, report, stats
from sweeps import run_study
from tests.conftest import ROOT
from tests.support.planted_runs import SMALL, fake_run
from tests.support.planted_tables import DIGITS, digits_frame, write_study


def answer_section(text):
  return text.split('## Setup')[0]


def test_the_answer_fits_one_screen_and_comes_first():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(8)), DIGITS)
  text = report.render(out, 'md')
  first = answer_section(text)
  assert len(first.splitlines()) <= 60, len(first.splitlines())
  assert first.startswith('# ') and '## Answer' in first
  assert '**Question.** Does training on gpu give the same test accuracy as on cpu' in first
  assert '**gpu − cpu: ' in first and '| platform residual: gap − numerics part |' in first
  assert 'share of the gap explained by numerics' in first and 'seeds for 80% power' in first
  assert '**Exploratory** (runs on 8 seeds (8 per arm at most), 6 declared (seeds 0–5))' in first
  assert (
    '**Confirmatory answer** (the declared seeds at the declared ±2 pp and platform pairs '
    'gpu − cpu)'
  ) in first and ', seeds 0–5)' in first
  for label in ('tpu_default', 'BN/16', 'bf16 activations', 'bf16_noise'):
    assert first.count(f'| {label} |') == 2, label  # one line per contrast and platform
  assert 'Holm over the 14 declared contrasts tested' in first
  later = text[len(first) :]
  assert later.index('## Setup') < later.index('## Why each verdict') < later.index('## Arms')
  assert '## Runs excluded' in later and '## Repeated seeds' in later


def test_without_a_declaration_the_answer_counts_the_pairs_instead_of_listing_them():
  """Runs whose root holds no declaration: every pair is tested (Holm over all of them) and the
  answer says how many came out how, the pairs themselves following in the report."""
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), {})
  text = report.render(out, 'md')
  first = answer_section(text)
  pairs = len(out.pairs)
  assert pairs == 16 * 15 // 2 and len(first.splitlines()) <= 60, len(first.splitlines())
  assert f'no declared contrasts: every pair, Holm over {pairs}' in first
  counts = out.pairs['verdict'].value_counts()
  assert f'{counts.get("inconclusive", 0)} inconclusive' in first
  assert 'get_study()' in first and first.count('\n| ') == 0
  assert '## Comparisons: every test' in text[len(first) :]


def test_version_differences_between_platforms_are_flagged_as_a_confound():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu')), DIGITS)
  first = answer_section(report.render(out, 'md'))
  assert '- cpu: cpu; jax 0.10.2, optax 0.2.8' in first
  assert '- gpu: gpu; jax 0.11.2, optax 0.2.8' in first
  assert '**Confound:** jax differ between the platforms' in first
  assert out.software.confounds == ['jax']
  same = digits_frame(('cpu', 'gpu')).assign(**{'versions.jax': '0.11.2'})
  first = answer_section(report.render(analyse.study_analysis(same, DIGITS), 'md'))
  assert 'Confound' not in first and 'the same recorded library versions' in first


def test_report_tex_holds_booktabs_tables_only():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu')), DIGITS)
  tex = report.render(out, 'latex')
  assert (
    tex.count('\\begin{table}') == tex.count('\\bottomrule') == 4
  )  # gap, contrasts, software, arms
  for label in ('tab:gap-gpu-cpu', 'tab:contrasts', 'tab:software', 'tab:arms'):
    assert f'\\label{{{label}}}' in tex
  assert '\\item' not in tex and '**' not in tex and '|' not in tex
  assert 'BN/16' in tex and 'bf16 activations' in tex


def test_two_roots_give_the_same_tables_as_one_root_holding_both(tmp_path, capsys):
  rng = np.random.default_rng(3)
  for platform in ('gpu', 'cpu'):
    for k, profile in enumerate(('native', 'f32', 'jax_gpu_default', 'bf16_noise')):
      for seed in range(3):
        fake_run(
          tmp_path / 'all' / platform,
          platform,
          profile,
          seed,
          0.9 + 0.002 * k + rng.normal(0, 0.004),
        )
  both = analyse.study_analysis(inputs.load_runs(str(tmp_path / 'all')), SMALL)
  roots = [str(tmp_path / 'all' / 'gpu'), str(tmp_path / 'all' / 'cpu')]  # gpu first: order-free
  apart = analyse.study_analysis(inputs.load_runs(roots), SMALL)
  for name in ('arms', 'contrasts'):
    pd.testing.assert_frame_equal(
      getattr(both, name).reset_index(drop=True), getattr(apart, name).reset_index(drop=True)
    )
  assert both.attribution.decomposition[0].R.estimate == pytest.approx(
    apart.attribution.decomposition[0].R.estimate, abs=1e-9
  )
  assert set(both.runs['run']) == set(apart.runs['run'])  # root + relative path
  with pytest.raises(ValueError, match='is under both') as e:
    inputs.load_runs([str(tmp_path / 'all'), roots[0]])  # a root inside another
  assert '\n' not in str(e.value)
  write_study(tmp_path / 'all' / 'gpu', SMALL)  # the command reads the roots' declaration
  analyse.main(['--runs', *roots, '--out', str(tmp_path / 'out')])
  captured = capsys.readouterr()
  assert '| native gap (gpu − cpu) |' in captured.out
  written = {
    line.split(str(tmp_path / 'out') + '/')[1]
    for line in captured.err.splitlines()
    if line.startswith('wrote ')
  }
  assert 'note: report_pairs.csv not written: no pairs tested' in captured.err  # declared only
  assert {
    'report.md',
    'report.tex',
    'report_contrasts.csv',
    'report_decomposition.csv',
    'attribution.md',
    'attribution_decomposition.csv',
    'figures/contrasts.pdf',
    'figures/gap_decomposition.png',
    'figures/accuracy_by_arm.pdf',
  } <= written
  assert (tmp_path / 'out' / 'report.md').read_text() == captured.out


def test_sweeps_study_checks_its_other_roots_before_the_sweep(tmp_path, capsys):
  code = run_study.main(
    ['--config=configs/digits.py:study', f'--root={tmp_path}/r', '--runs', str(tmp_path / 'nope')]
  )
  err = capsys.readouterr().err
  assert code == 2 and err.startswith('error: --runs:') and err.count('\n') == 1
  assert not (tmp_path / 'r').exists()  # nothing run or written


def test_study_flag_is_the_declaration_when_the_roots_declare_different_studies(tmp_path, capsys):
  """Two roots whose study.json differ are refused, unless --study gives the declaration: then
  their own declarations are not read."""
  rng = np.random.default_rng(5)
  for platform in ('gpu', 'cpu'):
    for profile in ('native', 'f32', 'jax_gpu_default', 'bf16_noise'):
      for seed in range(3):
        fake_run(tmp_path / platform, platform, profile, seed, 0.9 + rng.normal(0, 0.004))
  roots = [str(tmp_path / 'gpu'), str(tmp_path / 'cpu')]
  write_study(roots[0], SMALL)
  write_study(roots[1], {**SMALL, 'margin': 2.0})
  with pytest.raises(SystemExit) as e:
    analyse.main(['--runs', *roots])
  assert e.value.code == 2 and 'declare different studies' in capsys.readouterr().err
  study = write_study(tmp_path / 'declared', {**SMALL, 'margin': 0.7})
  analyse.main(['--runs', *roots, '--study', study])
  captured = capsys.readouterr()
  assert 'Equivalence margin ±0.7 pp' in captured.out and 'error' not in captured.err


def test_a_cpu_platform_identity_takes_the_declared_cpu_profile():
  """Records name the CPU's instruction set ('cpu-AVX2', runrecord.rules.platform_identity): the
  declaration's cpu profile still emulates it, so the gap is decomposed, and its determinism is
  the CPU's."""
  frame = digits_frame(('cpu', 'gpu'), seeds=range(4))
  frame['platform'] = frame['platform'].replace({'cpu': 'cpu-AVX2'})
  assert attribution.platform_profile(frame, DIGITS['platform_profile']) == {
    'cpu-AVX2': 'f32',
    'gpu': 'jax_gpu_default',
  }
  out = analyse.study_analysis(frame, DIGITS)
  assert out.attribution.decomposition[0].gap == 'gpu - cpu-AVX2'
  assert (
    out.arms.set_index('arm')['deterministic'].loc[lambda s: s.index.str.contains('cpu-AVX2')].all()
  )


def test_the_documented_python_use_runs_and_gives_the_typed_result(monkeypatch):
  """docs/statistics.md's Python example, run on a planted digits-study table."""
  with open(os.path.join(ROOT, 'docs', 'statistics.md'), encoding='utf-8') as f:
    code = f.read().split('```python\n', 1)[1].split('```', 1)[0]
  monkeypatch.setattr(inputs, 'load_runs', lambda root: digits_frame(('cpu', 'gpu')))
  lines = code.strip().splitlines()
  scope = {}
  # The example is run as the docs show it: its statements, then its last line's value.
  exec('\n'.join(lines[:-1]), scope)
  contrasts, verdict, confirmatory = eval(lines[-1], scope)
  assert isinstance(scope['study'], stats.Analysis)
  assert isinstance(scope['study'].attribution, attribution.Attribution)
  assert len(contrasts) > 0 and verdict in attribution.VERDICTS and confirmatory in (True, False)
