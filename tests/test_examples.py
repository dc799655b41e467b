"""The examples run as written: the script draws its figure, the notebook runs
top to bottom and shows the figure and the table.

Both run from a temporary folder, so nothing is written to the repository. The
notebook's kernel inherits this session's environment (conftest.py: the fast
compiling backend and the session's compilation cache), so it reuses what the
script compiled: the same model, data and strategies.
"""

import pathlib
import shutil
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAMES = ("DDP", "DiLoCo", "SPARTA")


def test_script_draws_the_comparison(tmp_path):
  out = tmp_path / "figure.png"
  proc = subprocess.run(
      [sys.executable, str(EXAMPLES / "compare_strategies.py"), "--out", str(out)],
      cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  png = out.read_bytes()
  assert png[:8] == PNG_SIGNATURE and len(png) > 20_000  # two panels, lines
  assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]  # nothing else
  header, *rows = proc.stdout.splitlines()[:4]
  assert header.split()[:3] == ["strategy", "eval", "loss"]
  assert [row.split()[0] for row in rows] == list(NAMES)


def test_notebook_runs_top_to_bottom(tmp_path):
  import nbclient
  import nbformat
  for name in ("compare_strategies.ipynb", "compare_strategies.py"):
    shutil.copy(EXAMPLES / name, tmp_path / name)
  nb = nbformat.read(tmp_path / "compare_strategies.ipynb", as_version=4)
  code = [cell for cell in nb.cells if cell.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code), \
      "commit the notebook without outputs"
  # Raises CellExecutionError, naming the cell, if any cell fails.
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = [o for c in code for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  images = [o.data["image/png"] for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 1 and len(images[0]) > 20_000  # base64 of the figure
  table = "".join(o.get("text", "") for o in code[-1].outputs).splitlines()
  assert table[0].split()[:3] == ["strategy", "eval", "loss"]
  assert [row.split()[0] for row in table[1:]] == list(NAMES)
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "compare_strategies.ipynb", "compare_strategies.py"]
