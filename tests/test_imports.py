"""``import lowbw`` stays light: what only some runs use (checkpoints,
plots, TensorBoard events, tokenizers, Parquet) is imported when used."""

import subprocess
import sys

LAZY = ("orbax", "matplotlib", "tensorboardX", "tokenizers", "pyarrow")


def test_import_lowbw_leaves_the_optional_heavy_modules_unimported():
  code = ("import sys, lowbw, lowbw.cli; print(sorted(m for m in "
          f"{LAZY!r} if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == "[]"
