"""The five official CelebA files: presence, format checks, parsing, fingerprint, and the splits
(`split_identity`: per identity, by file-name hash; docs/celeba.md "Task and split").

No TensorFlow here: a run whose decoded cache already exists needs only this module and numpy.
"""

import hashlib
import math
import os
import re
import warnings
import zipfile

import numpy as np

CELEBA_PAGE = 'https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html'
ZIP = 'img_align_celeba.zip'
MEMBER_DIR = 'img_align_celeba'  # the images are the zip's members img_align_celeba/<name>.jpg
PARTITION = 'list_eval_partition.txt'
ATTR = 'list_attr_celeba.txt'
LANDMARKS = 'list_landmarks_align_celeba.txt'
IDENTITY = 'identity_CelebA.txt'
FILES = (ZIP, PARTITION, ATTR, LANDMARKS, IDENTITY)
# Sizes of the official files (tensorflow_datasets/datasets/celeb_a/checksums.tsv).
OFFICIAL_SIZES = {
  ZIP: 1443490838,
  PARTITION: 2836386,
  ATTR: 26721026,
  LANDMARKS: 12156055,
  IDENTITY: 3424458,
}
ATTR_NAMES = (
  '5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose '
  'Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee '
  'Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard '
  'Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair '
  'Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young'
).split()
LANDMARK_NAMES = (
  'lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y '
  'rightmouth_x rightmouth_y'
).split()


def _bad(file_name, problem):
  return ValueError(
    f'config.data.manual_dir: {file_name} {problem}; replace it with the official '
    f'file from {CELEBA_PAGE}'
  )


def check_present(manual_dir):
  """One error listing every missing file (and where CelebA is obtained), before any work."""
  if not manual_dir:
    raise ValueError(
      f'config.data.manual_dir is empty: set it to a folder holding {", ".join(FILES)} '
      f'(CelebA is obtained from {CELEBA_PAGE}; "Align&Cropped Images" and "Anno")'
    )
  missing = [f for f in FILES if not os.path.isfile(os.path.join(manual_dir, f))]
  if missing:
    raise FileNotFoundError(
      f'config.data.manual_dir={manual_dir!r} lacks {", ".join(missing)}: '
      f'download them from the official CelebA page {CELEBA_PAGE} and put all '
      f'five files ({", ".join(FILES)}) in that folder'
    )


def _rows(path, header_lines, columns, file_name):
  """Rows of a whitespace table as (names, int array [N, columns]), checking shape and count."""
  with open(path) as f:
    lines = f.read().split('\n')
  if lines and lines[-1] == '':
    lines = lines[:-1]
  head, body = lines[:header_lines], lines[header_lines:]
  if len(head) < header_lines:
    raise _bad(file_name, 'is empty or lacks its header')
  parts = [line.split(None, 1) for line in body]
  for number, part in enumerate(parts, header_lines + 1):
    if len(part) != 2 or not part[0].endswith('.jpg') or len(part[1].split()) != columns:
      raise _bad(
        file_name,
        f'line {number} is not a name and {columns} numbers (truncated or not the official file?)',
      )
  try:  # fast: one C parse of every value (numpy >= 2.4 raises on a non-integer, older warned)
    with warnings.catch_warnings():
      warnings.simplefilter('error', DeprecationWarning)
      text = ' '.join(part[1] for part in parts)
      array = np.fromstring(text, dtype=np.int64, sep=' ') if parts else np.zeros(0, np.int64)
  except (ValueError, DeprecationWarning):
    array = None
  if array is None or array.size != len(parts) * columns:
    raise _not_integer(parts, header_lines, file_name)
  names = [part[0] for part in parts]
  return head, np.asarray(names), array.reshape(len(parts), columns)


def _not_integer(parts, header_lines, file_name):
  """The error naming the first value that is not a plain integer, with its line number."""
  for number, (_, values) in enumerate(parts, header_lines + 1):
    for value in values.split():
      if not re.fullmatch(r'[-+]?[0-9]+', value):
        return _bad(file_name, f'line {number} holds {value!r}, not an integer')
  return _bad(file_name, 'holds a value that is not an integer')


def _counted(manual_dir, file_name, headings):
  """A file with a count line and a heading line (attributes, landmarks)."""
  head, names, values = _rows(os.path.join(manual_dir, file_name), 2, len(headings), file_name)
  if not head[0].strip().isdigit():
    raise _bad(file_name, f'starts with {head[0][:40]!r}, not the row count')
  if head[1].split() != list(headings):
    raise _bad(file_name, 'has unexpected column names on line 2')
  if int(head[0]) != len(names):
    raise _bad(file_name, f'declares {int(head[0])} rows but has {len(names)} (truncated?)')
  return names, values


def _by_name(reference, names, values, file_name):
  """`values` reordered to the sorted `reference` names; every name must be there exactly once."""
  order = np.argsort(names, kind='stable')
  names, values = names[order], values[order]
  if len(names) != len(reference) or not np.array_equal(names, reference):
    missing = np.setdiff1d(reference, names)
    extra = np.setdiff1d(names, reference)
    raise _bad(
      file_name,
      f'lists other images than {PARTITION}: {len(missing)} missing '
      f'(e.g. {missing[:3].tolist()}), {len(extra)} extra or repeated '
      f'(e.g. {extra[:3].tolist()}) (truncated?)',
    )
  return values


def zip_members(manual_dir):
  """{file name: ZipInfo} of the images `img_align_celeba/<name>.jpg` in img_align_celeba.zip
  (see `members_of`); a truncated zip is an error."""
  try:
    with zipfile.ZipFile(os.path.join(manual_dir, ZIP)) as zf:
      return members_of(zf)
  except (zipfile.BadZipFile, OSError) as e:
    raise _bad(ZIP, f'is not a readable zip ({e}; truncated download?)') from None


def members_of(zf):
  """{file name: ZipInfo} of the images in the open zip `zf`: only members at
  `img_align_celeba/<name>.jpg` count (a stray `other/000004.jpg` or `__MACOSX/...` is ignored,
  never taken for image 000004); one name twice is an error naming both entries."""
  members, position = {}, {}
  for index, info in enumerate(zf.infolist()):
    folder, _, name = info.filename.partition('/')
    if folder != MEMBER_DIR or '/' in name or not name.endswith('.jpg'):
      continue
    if name in members:
      raise _bad(
        ZIP,
        f'holds {info.filename} twice (entries {position[name]} and {index}, '
        f'{members[name].file_size} and {info.file_size} bytes)',
      )
    members[name], position[name] = info, index
  return members


def read_metadata(manual_dir):
  """Check and parse the five files: sorted names, partition, identity, attributes (-1/1)."""
  check_present(manual_dir)
  _, names, partition = _rows(os.path.join(manual_dir, PARTITION), 0, 1, PARTITION)
  order = np.argsort(names, kind='stable')
  names, partition = names[order], partition[order, 0]
  if len(names) == 0:
    raise _bad(PARTITION, 'lists no images')
  if len(np.unique(names)) != len(names):
    raise _bad(PARTITION, 'lists an image twice')
  if not np.isin(partition, (0, 1, 2)).all():
    raise _bad(PARTITION, 'has a partition other than 0, 1 or 2')
  _, id_names, identity = _rows(os.path.join(manual_dir, IDENTITY), 0, 1, IDENTITY)
  identity = _by_name(names, id_names, identity, IDENTITY)[:, 0]
  attr_names, attributes = _counted(manual_dir, ATTR, ATTR_NAMES)
  attributes = _by_name(names, attr_names, attributes, ATTR)
  if not np.isin(attributes, (-1, 1)).all():
    raise _bad(ATTR, 'has attribute values other than -1 and 1')
  lm_names, landmarks = _counted(manual_dir, LANDMARKS, LANDMARK_NAMES)
  _by_name(names, lm_names, landmarks, LANDMARKS)
  members = zip_members(manual_dir)
  absent = [n for n in names if n not in members]
  if absent:
    raise _bad(ZIP, f'lacks {len(absent)} images listed in {PARTITION} (e.g. {absent[:3]})')
  return {
    'names': names,
    'partition': partition.astype(np.int8),
    'identity': identity.astype(np.int64),
    'attributes': attributes.astype(np.int8),
  }


def source_fingerprint(manual_dir):
  """A hash of the five files' contents: zip members' names, CRC-32s and sizes, and the txt
  bytes."""
  digest = hashlib.sha256()
  for name, info in sorted(zip_members(manual_dir).items()):
    digest.update(f'{name}:{info.CRC}:{info.file_size}\n'.encode())
  for file_name in FILES[1:]:
    with open(os.path.join(manual_dir, file_name), 'rb') as f:
      digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()[:16]


def official_sizes(manual_dir):
  """True when all five files have the official byte sizes (i.e. this is the real CelebA)."""
  return all(os.path.getsize(os.path.join(manual_dir, f)) == s for f, s in OFFICIAL_SIZES.items())


def test_count(n, test_fraction):
  """Test images of an identity with n images: round half up, at most n - 1 (0 for singletons)."""
  return min(max(n - 1, 0), math.floor(n * test_fraction + 0.5))


def split_identity(names, identity, test_fraction, split_seed):
  """Boolean test mask over `names`: each identity split exactly (docs/celeba.md, "Task and
  split")."""
  keys = np.asarray(
    [int(hashlib.sha256(f'{int(split_seed)}:{n}'.encode()).hexdigest()[:16], 16) for n in names],
    dtype=np.uint64,
  )
  order = np.lexsort((np.argsort(np.argsort(names, kind='stable')), keys, identity))
  ids, starts, counts = np.unique(identity[order], return_index=True, return_counts=True)
  test = np.zeros(len(names), bool)
  for start, count in zip(starts, counts, strict=True):
    test[order[start : start + test_count(int(count), test_fraction)]] = True
  return test


def split_official(partition):
  """(train mask, test mask) of the official partition: 0 train, 2 test (1, validation, unused)."""
  return partition == 0, partition == 2
