"""The declaration as a schema (issue 36): every study.json and get_study() key known, typed and in
range, the arms and levels it names present among the runs, each problem one line naming the file
and the key (never a flag the user did not give). Planted CSVs and declarations, no training."""

import json

import pytest

from analysis import analyse, attribute, declaration, inputs
from tests.support.commands import cli_error
from tests.support.planted_tables import DIGITS, digits_frame


@pytest.fixture(scope='module')
def study_csv(tmp_path_factory):
  """The digits fraction's 8 arms x 6 seeds on cpu and gpu, as a CSV."""
  path = tmp_path_factory.mktemp('csv') / 'runs.csv'
  digits_frame(platforms=('cpu', 'gpu')).to_csv(path, index=False)
  return str(path)


def study_file(tmp_path, **changes):
  """The digits declaration with `changes` (None: the key removed) as tmp_path/study.json."""
  declared = {k: v for k, v in {**DIGITS, **changes}.items() if v is not None}
  path = tmp_path / 'study.json'
  path.write_text(json.dumps(declared))
  return str(path)


def refused(capsys, study_csv, study, main=analyse.main, extra=()):
  """The `error:` lines of the analysis of the planted runs under declaration `study`."""
  return cli_error(capsys, main, ['--csv', study_csv, '--study', study, *extra])


@pytest.mark.parametrize(
  'key, value, says',
  [
    ('seeds', -4, 'seeds: -4 is not a seed count; give a positive whole number k'),
    ('seeds', 2.5, 'seeds: 2.5 is not a seed count'),
    ('seeds', [0, 1, 'x'], "seeds: 'x' is not a seed; give whole numbers in [0, 4294967295]"),
    ('seeds', [0, 1, 1], 'seeds: seed 1 is listed twice'),
    ('paired_sd', 'x', "paired_sd: 'x' is not a positive number"),
    ('seed_sd', -1.0, 'seed_sd: -1.0 is not a positive number'),
    ('min_share', 150, 'min_share: 150 is not a share in (0, 1]; give e.g. 0.5'),
    ('min_share', 'abc', "min_share: 'abc' is not a share in (0, 1]"),
    ('min_share', 0, 'min_share: 0 is not a share in (0, 1]'),
    (
      'labels',
      {'profile': '{0}{1}'},
      "labels: profile: '{0}{1}' does not format one level (IndexError",
    ),
    (
      'labels',
      {'profile': '{name}'},
      "labels: profile: '{name}' does not format one level (KeyError",
    ),
    (
      'factors',
      'platform',
      "factors: 'platform' is text, not a list (it would be read letter by "
      'letter); write ["platform"]',
    ),
    ('reference', 'native', "reference: 'native' is not an arm; give {factor: level}"),
    ('native', {'profile': 'native', 'compute_dtype': 'float32'}, 'native: '),
    ('compare', [['tpu', 'tpu']], "compare: ['tpu', 'tpu'] compares tpu with itself"),
    ('compare', 'tpu,gpu', "compare: 'tpu,gpu' is not a list of platform pairs"),
    ('margin_reason', 3, 'margin_reason: 3 is not text'),
    (
      'margin_reason',
      'wide\n## Injected\n| a | b |',
      "margin_reason: 'wide\\n## Injected\\n| a | b |' holds a line break; write it on one line",
    ),
    ('seed_sd_source', 'pilot\r', "seed_sd_source: 'pilot\\r' holds a line break"),
  ],
)
def test_each_key_is_typed_and_in_range_naming_the_file_and_key(
  tmp_path, capsys, study_csv, key, value, says
):
  """Before: seeds -4 read '-4 declared (seeds 0–-5)' and no confirmatory answer, seeds [0..3] a
  TypeError, min_share 150 or 'abc' accepted or a TypeError, '{0}{1}' an IndexError, factors
  'platform' read letter by letter."""
  study = study_file(tmp_path, **{key: value})
  lines = refused(capsys, study_csv, study)
  assert len(lines) == 1 and lines[0].startswith(f'error: {study}: {says}'), lines


def test_an_unknown_key_is_one_line_with_the_nearest_key(tmp_path, capsys, study_csv):
  """Before: ignored, so the noise arm a typo hid was tested as an ordinary contrast."""
  study = study_file(tmp_path, noise_arm=None, nosie_arm={'profile': 'bf16_noise'})
  assert refused(capsys, study_csv, study) == [
    f"error: {study}: 'nosie_arm' is not a declaration key; did you mean 'noise_arm'?"
  ]
  study = study_file(tmp_path, zzz=1)
  assert refused(capsys, study_csv, study)[0].startswith(
    f"error: {study}: 'zzz' is not a declaration key; the keys: margin, margin_reason, factors"
  )


def test_a_noise_arm_naming_no_level_is_refused_not_tested_as_a_contrast(
  tmp_path, capsys, study_csv
):
  """Case 9. Before: 'no noise floor' and the noise arm judged among the contrasts, exit 0."""
  study = study_file(tmp_path, noise_arm={'profile': 'bf16_nosie'})
  lines = refused(capsys, study_csv, study)
  assert len(lines) == 1 and lines[0].startswith(
    f'error: {study}: noise_arm: no run has profile=bf16_nosie (levels among the 96 runs: '
  )
  assert "did you mean 'bf16_noise'?" in lines[0]


@pytest.mark.parametrize(
  'key, value, says',
  [
    ('reference', {'profile': 'natve'}, 'reference: no run has profile=natve'),
    (
      'platform_profile',
      {'gpu': 'jax_gpu_defualt', 'cpu': 'f32'},
      'platform_profile: no run has profile=jax_gpu_defualt',
    ),
    ('native', {'profile': 'nativ'}, 'native: no run has profile=nativ'),
    ('noise_of', {'compute_dtype': 'float23'}, 'noise_of: no run has compute_dtype=float23'),
    (
      'factors',
      [*DIGITS['factors'], 'profle'],
      "factors: no column 'profle' among the runs; did you mean 'profile'?",
    ),
  ],
)
def test_a_bad_level_is_blamed_on_the_file_and_key_never_on_a_flag(
  tmp_path, capsys, study_csv, key, value, says
):
  """Before: a bad platform_profile read '--platform-profile: profile has no level ...' and a bad
  reference '--reference: ...': flags the user never gave."""
  study = study_file(tmp_path, **{key: value})
  lines = refused(capsys, study_csv, study)
  assert len(lines) == 1 and lines[0].startswith(f'error: {study}: {says}'), lines
  assert '--' not in lines[0].split(': ', 2)[2]


def test_an_arm_naming_an_undeclared_factor_is_refused(tmp_path, capsys, study_csv):
  study = study_file(tmp_path, reference={**DIGITS['reference'], 'compute_dtpe': 'float32'})
  assert refused(capsys, study_csv, study) == [
    f"error: {study}: reference: 'compute_dtpe' is not one of the declared factors (platform, "
    "profile, batchnorm_group, compute_dtype); did you mean 'compute_dtype'? add it to factors, "
    'or correct it'
  ]


def test_every_problem_is_its_own_line(tmp_path, capsys, study_csv):
  study = study_file(tmp_path, seeds=-4, paired_sd='x', min_share=150)
  lines = refused(capsys, study_csv, study)
  assert [line.split(': ')[2] for line in lines] == ['min_share', 'paired_sd', 'seeds']


def test_a_list_of_seeds_is_the_confirmatory_set(tmp_path, capsys, study_csv):
  """Case 16: seeds [0, 1, 2, 3] was a TypeError; now those four seeds are the confirmatory
  analysis and the other two exploratory."""
  study = study_file(tmp_path, seeds=[0, 1, 2, 3])
  out = analyse.study_analysis(inputs.read_csv(study_csv), declaration.load(study))
  assert out.scope.declared_seeds == [0, 1, 2, 3] and out.scope.confirmatory is False
  assert out.scope.deviations == ['runs on 6 seeds (6 per arm at most), 4 declared (seeds 0–3)']
  assert out.confirmatory.scope.analysed_seeds == [0, 1, 2, 3]
  analyse.main(['--csv', study_csv, '--study', study])
  assert 'runs on 6 seeds (6 per arm at most), 4 declared (seeds 0–3)' in capsys.readouterr().out


def test_get_study_is_checked_as_study_json_is(tmp_path):
  path = tmp_path / 'cfg.py'
  path.write_text(
    'from configs import digits\nget_config = digits.get_config\n\n'
    'def get_study(arg=None):\n  return {**digits.get_study(arg), "min_share": 50}\n'
  )
  with pytest.raises(
    ValueError, match=rf'^{path}:study get_study\(\): min_share: 50 is not a share'
  ):
    declaration.load(f'{path}:study')


def test_the_min_share_flag_is_a_share(tmp_path, capsys, study_csv):
  """--min-share 150 was accepted (a share of 150 can never be reached: never 'explained')."""
  for bad in ('150', '0', 'abc', 'nan'):
    lines = cli_error(
      capsys,
      attribute.main,
      ['--csv', study_csv, '--factors', 'platform', 'profile', '--min-share', bad],
    )
    assert len(lines) == 1 and lines[0].startswith('error: argument --min-share: ')


def test_the_shipped_declarations_pass():
  for spec in (
    'configs/digits.py:study',
    'configs/celeba.py:gpu',
    'results/digits_h100_cpu.study.json',
  ):
    assert declaration.problems(declaration.load(spec)) == []


def test_a_margin_reason_on_two_lines_is_refused_from_the_flag_too(tmp_path, capsys, study_csv):
  """Issue 42, item 12. Before: a newline in margin_reason wrote a heading and a table into
  report.md (the reason is printed inside a sentence), exit 0."""
  out = tmp_path / 'out'
  argv = ['--csv', study_csv, '--margin', '1', '--margin-reason', 'pilot\n## Injected']
  assert cli_error(capsys, analyse.main, [*argv, '--out', str(out)]) == [
    "error: --margin-reason: 'pilot\\n## Injected' holds a line break; write it on one line"
  ]
  assert not out.exists()


@pytest.mark.parametrize(
  'labels, says',
  [
    (
      {'profile': 'same'},
      'profile: \'same\' gives every level one label; write {} where the level goes, e.g. "BN/{}"',
    ),
    (
      {'profile': {'native': 'x', 'f32': 'x'}},
      'profile: levels native, f32 have one label; give each level its own',
    ),
  ],
)
def test_labels_that_make_two_levels_one_text_are_named_not_the_factors(
  tmp_path, capsys, study_csv, labels, says
):
  """Issue 42, item 13. Before: 'have the same declared factor levels on one platform; declare
  the factor that separates them', though the factors were declared and the labels merged them."""
  study = study_file(tmp_path, labels={**DIGITS['labels'], **labels})
  assert refused(capsys, study_csv, study) == [f'error: {study}: labels: {says}']


def test_labels_of_two_factors_that_meet_in_one_text_are_named(tmp_path, capsys, study_csv):
  """Issue 42, item 13, across factors: profile tpu_default labelled 'BN/16' meets batchnorm_group
  16's 'BN/{}' (each factor's labels are distinct; two arms read the same)."""
  labels = {**DIGITS['labels'], 'profile': {'tpu_default': 'BN/16'}}
  with pytest.raises(SystemExit) as stop:
    analyse.main(['--csv', study_csv, '--study', study_file(tmp_path, labels=labels)])
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert stop.value.code == 2 and last.startswith("error: --study: labels: arms '")
  assert 'differ in profile=tpu_default and native, batchnorm_group=0 and 16' in last
  assert last.endswith("both labelled 'BN/16'; give each level its own label")
