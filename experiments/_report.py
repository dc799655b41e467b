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
