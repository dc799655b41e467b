"""A progress bar on the terminal: steps, ETA and the latest losses."""

import sys

from tqdm.auto import tqdm


class ProgressBar:
  """Wraps tqdm; updated once per chunk of rounds, never per step."""

  def __init__(self, total_steps: int, initial: int = 0, desc: str = "train",
               unit: str = "step"):
    self._bar = tqdm(total=total_steps, initial=initial, desc=desc, unit=unit,
                     file=sys.stderr, dynamic_ncols=True, leave=True)

  def update(self, step: int, row: dict) -> None:
    self._bar.update(step - self._bar.n)
    postfix = {}
    for name in ("train_loss", "eval_loss"):
      value = row.get(name)
      if value is not None and value == value:
        postfix[name] = f"{value:.4f}"
    if postfix:
      self._bar.set_postfix(postfix, refresh=False)
    self._bar.refresh()

  def close(self) -> None:
    self._bar.close()


def is_terminal() -> bool:
  """Whether stderr, where progress is drawn, is a terminal."""
  return sys.stderr.isatty()
