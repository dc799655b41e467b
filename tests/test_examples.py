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


def _documented_command() -> list[str]:
  """examples/README.md's ``jupyter execute`` line, as words."""
  text = (EXAMPLES / "README.md").read_text()
  (line,) = [l for l in text.splitlines() if l.startswith("jupyter execute")]
  return line.split()


def test_notebook_runs_top_to_bottom(tmp_path):
  import nbformat
  for name in ("compare_strategies.ipynb", "compare_strategies.py"):
    shutil.copy(EXAMPLES / name, tmp_path / name)
  nb = nbformat.read(tmp_path / "compare_strategies.ipynb", as_version=4)
  assert all(not c.outputs and c.execution_count is None for c in nb.cells
             if c.cell_type == "code"), "commit the notebook without outputs"
  # The documented command, on the copy: jupyter execute, or nbclient's
  # own entry point where no jupyter command is on the PATH.
  words = _documented_command()
  assert words[-1] == "examples/compare_strategies.ipynb"
  launch = (["jupyter", "execute"] if shutil.which("jupyter") else
            [sys.executable, "-c", "from nbclient.cli import main; main()"])
  proc = subprocess.run([*launch, *words[2:-1], "compare_strategies.ipynb"],
                        cwd=tmp_path, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  output = next(w.split("=", 1)[1] for w in words if w.startswith("--output="))
  nb = nbformat.read(tmp_path / output, as_version=4)
  code = [cell for cell in nb.cells if cell.cell_type == "code"]
  outputs = [o for c in code for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  images = [o.data["image/png"] for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 1 and len(images[0]) > 20_000  # base64 of the figure
  table = "".join(o.get("text", "") for o in code[-1].outputs).splitlines()
  assert table[0].split()[:3] == ["strategy", "eval", "loss"]
  assert [row.split()[0] for row in table[1:]] == list(NAMES)
  png = (tmp_path / "compare_strategies.png").read_bytes()
  assert png[:8] == PNG_SIGNATURE and len(png) > 20_000  # the figure, a file
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
      "compare_strategies.ipynb", "compare_strategies.py", output,
      "compare_strategies.png"])
