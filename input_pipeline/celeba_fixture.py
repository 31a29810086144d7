"""Synthetic CelebA files, never real faces: each identity a hue with stripes, per-image noise,
`Eyeglasses` and `Smiling` drawn in. `python -m input_pipeline.celeba_fixture --out DIR`."""

import argparse
import colorsys
import io
import os
import zipfile

import numpy as np
from PIL import Image

from input_pipeline import celeba

HEIGHT, WIDTH = 218, 178
ATTR_NAMES, LANDMARK_NAMES = celeba.ATTR_NAMES, celeba.LANDMARK_NAMES
LANDMARKS_MEAN = (69, 111, 107, 111, 88, 135, 72, 152, 105, 152)
EYEGLASSES, SMILING = ATTR_NAMES.index('Eyeglasses'), ATTR_NAMES.index('Smiling')


def _draw(identity_index, num_identities, eyeglasses, smiling, rng):
  """One 218x178x3 uint8 image of an identity: its hue and stripes, per-image noise and marks."""
  hue = identity_index / num_identities
  base = np.array(colorsys.hsv_to_rgb(hue, 0.75, 0.85)) * 255.0
  yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
  period = 12 + 4 * (identity_index % 5)
  angle = np.pi * (identity_index % 4) / 4
  stripes = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period)
  image = base[None, None, :] * (1.0 + 0.15 * stripes[..., None]) * rng.uniform(0.85, 1.15)
  image = image + rng.normal(0.0, 12.0, size=image.shape)
  if eyeglasses:
    image[100:122, 40:140] = 20.0
  if smiling:
    image[145:160, 60:118] = 245.0
  return np.clip(image, 0, 255).astype(np.uint8)


def generate(out, identities=20, max_images=12, seed=0, quality=90, images=None, progress=None):
  """Write a fixture into folder `out` (`images` in all, else random counts per identity); returns
  {file name: identity id}. `progress(done, total)` is called every 10,000 images."""
  rng = np.random.default_rng(seed)
  os.makedirs(out, exist_ok=True)
  ids = np.sort(rng.choice(np.arange(1, 10178), size=identities, replace=False))
  if images is None:  # about a quarter singletons (at least one), the rest 2..max_images
    counts = rng.integers(2, max(2, max_images) + 1, size=identities)
    counts[rng.permutation(identities)[: max(1, identities // 4)]] = 1
  elif images < identities:
    raise ValueError(f'--images: {images} is fewer than --identities {identities}')
  else:  # each identity at least one image, exactly `images` in all
    counts = 1 + rng.multinomial(images - identities, np.full(identities, 1 / identities))
  owners = rng.permutation(np.repeat(np.arange(identities), counts))  # interleaved, as in CelebA
  partition_of = rng.choice(3, size=identities, p=(0.8, 0.1, 0.1))  # identity-disjoint partitions
  partition_of[: min(3, identities)] = np.arange(min(3, identities))  # every partition non-empty
  identity_attrs = rng.choice((-1, 1), size=(identities, len(ATTR_NAMES)))
  names = [f'{i + 1:06d}.jpg' for i in range(len(owners))]
  attr_rows, landmark_rows, id_rows, part_rows = [], [], [], []
  with zipfile.ZipFile(os.path.join(out, 'img_align_celeba.zip'), 'w', zipfile.ZIP_DEFLATED) as zf:
    zf.writestr(zipfile.ZipInfo('img_align_celeba/'), b'')
    for done, (name, owner) in enumerate(zip(names, owners, strict=True), 1):
      if progress and done % 10000 == 0:
        progress(done, len(names))
      attrs = identity_attrs[owner].copy()
      attrs[EYEGLASSES], attrs[SMILING] = rng.choice((-1, 1), size=2)
      image = _draw(owner, identities, attrs[EYEGLASSES] > 0, attrs[SMILING] > 0, rng)
      buffer = io.BytesIO()
      Image.fromarray(image).save(buffer, format='JPEG', quality=quality)
      zf.writestr(f'img_align_celeba/{name}', buffer.getvalue())
      landmarks = np.asarray(LANDMARKS_MEAN) + rng.integers(-4, 5, size=len(LANDMARKS_MEAN))
      # The official spacing: the first value bare, the rest width 3 (attributes) or 5.
      a, m = attrs.tolist(), landmarks.tolist()
      attr_rows.append(f'{name} {a[0]}' + ''.join(f'{v:3d}' for v in a[1:]))
      landmark_rows.append(f'{name} {m[0]}' + ''.join(f'{v:5d}' for v in m[1:]))
      id_rows.append(f'{name} {ids[owner]}')
      part_rows.append(f'{name} {partition_of[owner]}')
  n = len(names)
  files = {
    'list_attr_celeba.txt': [str(n), ' '.join(ATTR_NAMES) + ' '] + attr_rows,
    'list_landmarks_align_celeba.txt': [str(n), ' '.join(LANDMARK_NAMES)] + landmark_rows,
    'identity_CelebA.txt': id_rows,
    'list_eval_partition.txt': part_rows,
  }
  for file_name, lines in files.items():
    with open(os.path.join(out, file_name), 'w', newline='\n') as f:
      f.write('\n'.join(lines) + '\n')
  return {name: int(ids[owner]) for name, owner in zip(names, owners, strict=True)}


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m input_pipeline.celeba_fixture',
    description=' '.join(__doc__.split('\n\n')[0].split()),
  )
  parser.add_argument('--out', required=True, help='folder to write the five files into')
  parser.add_argument('--identities', type=int, default=20, help='identities in the fixture')
  parser.add_argument('--max_images', type=int, default=12, help='most images of one identity')
  parser.add_argument('--seed', type=int, default=0, help='seed of the generated images')
  parser.add_argument('--quality', type=int, default=90, help='JPEG quality')
  parser.add_argument(
    '--images',
    type=int,
    default=None,
    help='exactly this many images in all (default: random counts per identity)',
  )
  args = parser.parse_args(argv)
  owners = generate(
    args.out,
    args.identities,
    args.max_images,
    args.seed,
    args.quality,
    args.images,
    progress=lambda done, total: print(f'{done}/{total} images', flush=True),
  )
  print(f'wrote {len(owners)} images of {len(set(owners.values()))} identities to {args.out}')


if __name__ == '__main__':
  main()
