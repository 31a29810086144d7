"""Emulated hardware product formats (filled in by the numerics issue)."""

EMULATE_MODES = ('none',)


def emulated(product, x, kernel, mode):
  raise ValueError(f'config.numerics.emulate must be one of {EMULATE_MODES}, got {mode!r}')
