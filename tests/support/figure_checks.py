"""What the figure tests (tests/unit/test_figures*.py) look at in a drawn matplotlib figure."""

from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.patches import Patch


def drawn(artist):
  """Whether an artist with a legend label has something on the canvas."""
  if hasattr(artist, 'get_offsets'):
    return len(artist.get_offsets()) > 0
  if hasattr(artist, 'get_xdata'):
    return len(artist.get_xdata()) > 0
  if hasattr(artist, 'lines'):  # an errorbar container
    return len(artist.lines[0].get_xdata()) > 0
  return artist.get_visible()


def legend_problems(fig):
  """Legend labels with no drawn artist of that label in the figure's axes; a colour key (a
  patch, e.g. 'on gpu') needs a drawn line of its colour."""
  artists, colours = {}, set()
  for ax in fig.axes:
    for a in [*ax.lines, *ax.collections, *ax.patches, *ax.containers]:
      if drawn(a):
        artists.setdefault(a.get_label(), a)
    colours |= {to_hex(line.get_color()) for line in ax.lines if drawn(line)}
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
  keys = [
    (t.get_text(), h)
    for leg in legends
    for t, h in zip(leg.get_texts(), leg.legend_handles, strict=True)
  ]
  assert keys, 'no legend at all'

  def colour_key(h):
    return (isinstance(h, Patch) and to_hex(h.get_facecolor()) in colours) or (
      isinstance(h, Line2D) and to_hex(h.get_color()) in colours
    )

  return [label for label, h in keys if label not in artists and not colour_key(h)]
