"""What every experiment's report does: write the generated part, keep the
hand-written reading below it."""

import os

HAND_WRITTEN = "## Reading (written by hand"


def write_report(path: str, generated: str) -> None:
  """Writes ``generated`` to ``path``, keeping a section that starts with
  ``HAND_WRITTEN`` (a reading of the results) from the file already there."""
  kept = ""
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
    if HAND_WRITTEN in text:
      kept = "\n" + text[text.index(HAND_WRITTEN):]
  with open(path, "w") as f:
    f.write(generated.rstrip("\n") + "\n" + kept)


def axes(figsize=(7, 4.5)):
  """A figure and its axes, drawn off screen (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt.subplots(figsize=figsize)


def save_plot(fig, ax, path: str, xlabel: str, ylabel: str,
              legend_size: int = 8) -> None:
  """The reports' common finish: log x axis, labels, legend, grid, PNG."""
  ax.set_xscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=legend_size)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
