"""A new user's first hour: what the default run and the commands say
while they work, and the words they print."""

import re

import pytest

from lowbw import cli
from lowbw.cli import _heartbeat, _train

_TINY = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "40", "--H", "5"]


def test_a_compile_longer_than_the_threshold_is_said_on_stderr(
    capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(_heartbeat, "AFTER_S", 0.0)
  monkeypatch.setattr(_heartbeat, "POLL_S", 0.01)
  assert cli.main(_TINY + ["--out", str(tmp_path / "r")]) == 0
  err = capsys.readouterr().err
  assert re.search(r"lowbw: compiling the workers' training chunk and the "
                   r"evaluation \(\d+ s\)", err), err


def test_no_heartbeat_under_the_threshold_or_with_no_progress(
    capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(_heartbeat, "AFTER_S", 0.0)
  monkeypatch.setattr(_heartbeat, "POLL_S", 0.01)
  assert cli.main(_TINY + ["--no-progress", "--out", str(tmp_path / "r")]) == 0
  assert "compiling" not in capsys.readouterr().err


def test_off_a_terminal_rows_print_about_twenty_lines_and_every_eval(
    capsys, tmp_path):
  assert cli.main(_TINY + ["--eval-every", "5", "--out",
                           str(tmp_path / "r")]) == 0
  rows = [l for l in capsys.readouterr().out.splitlines()
          if l.startswith("step ")]
  steps = [int(l.split()[1].split("/")[0]) for l in rows]
  every = 40 // _train.PRINTED_ROWS
  assert steps == sorted(set(range(every, 41, every)) | set(range(5, 41, 5)))
  assert all("eval_loss" in l for l, s in zip(rows, steps) if s % 5 == 0)


def test_an_explicit_log_every_prints_every_logged_row(capsys, tmp_path):
  assert cli.main(_TINY + ["--log-every", "1", "--out",
                           str(tmp_path / "r")]) == 0
  rows = [l for l in capsys.readouterr().out.splitlines()
          if l.startswith("step ")]
  assert len(rows) == 40


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("run") / "r"
  assert cli.main(_TINY + ["--steps", "10", "--no-progress", "--no-plot",
                           "--out", str(out)]) == 0
  return out


@pytest.mark.parametrize("command", ["train", "bench", "eval"])
def test_a_missing_data_path_is_said_missing(command, tiny_run, capsys,
                                             tmp_path):
  missing = str(tmp_path / "no" / "such")
  argv = {"train": ["train", "--steps", "2"], "bench": ["bench"],
          "eval": ["eval", str(tiny_run)]}[command]
  assert cli.main(argv + ["--data", missing]) == 2
  err = capsys.readouterr().err
  assert f"--data='{missing}' is invalid: no such file or folder" in err, err


def _summary_of(out_dir) -> dict:
  import json
  with open(out_dir / "summary.json") as f:
    return json.load(f)


@pytest.mark.parametrize("speeds", ["1,1,1,0.25", "1,0.5,0.8,1", None])
def test_the_summary_names_the_wait_for_the_slowest(speeds, capsys, tmp_path):
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "4",
          "--batch-size", "4", "--steps", "40", "--H", "5", "--hardware",
          "10ms", "--no-progress", "--no-plot", "--out", str(tmp_path / "r")]
  assert cli.main(argv + (["--speeds", speeds] if speeds else [])) == 0
  out = capsys.readouterr().out
  summary = _summary_of(tmp_path / "r")
  # Reference: each step lasts as long as its slowest worker's.
  step_s = 0.010
  slowest = step_s / min(float(v) for v in (speeds or "1").split(","))
  expected = 40 * (slowest - step_s)
  assert "of the nominal time: compute and communication at the nominal " \
         "speed, without waiting" in out
  if not expected:
    assert "wait_s" not in summary and "  waiting  " not in out
    return
  assert summary["wait_s"] == pytest.approx(expected, rel=1e-5)
  assert summary["wait_share"] == pytest.approx(
      expected / summary["sim_time_s"], rel=1e-5)
  share = f"{expected / summary['sim_time_s']:.1%}"
  assert re.search(r"  waiting +\S+ per step for the slowest workers \("
                   + re.escape(share) + " of the simulated time", out), out


_STUDY = dict(data="digits", hidden="8", workers=2, batch_size=4, steps=8,
              eval_examples=32)


@pytest.fixture(scope="module")
def small_study():
  import lowbw
  import contextlib
  import io
  said = io.StringIO()
  with contextlib.redirect_stdout(said):
    study = lowbw.study(lowbw.Config(**_STUDY, H=2), {"H": [2, 4]},
                        seeds=[0])
  return study, said.getvalue()


def test_off_a_terminal_a_study_says_each_finished_point(small_study):
  study, said = small_study
  lines = said.splitlines()
  assert len(lines) == 2, said
  for n, (line, r) in enumerate(zip(lines, study.points), 1):
    loss = r.summary["final_eval_loss"]
    assert line.startswith(f"study: point {n}/2 done (H={r.values['H']}, "
                           f"seed 0) final loss {loss:.4f}, "), line


def _without_pandas(monkeypatch):
  import builtins
  real = builtins.__import__

  def no_pandas(name, *a, **k):
    if name == "pandas" or name.startswith("pandas."):
      raise ImportError("no pandas here")
    return real(name, *a, **k)

  monkeypatch.setattr(builtins, "__import__", no_pandas)


def test_without_pandas_a_study_table_prints_as_a_table(small_study,
                                                        monkeypatch):
  study, _ = small_study
  _without_pandas(monkeypatch)
  final = study.final()
  assert isinstance(final, dict)  # the dict of arrays it was
  text = repr(final)
  lines = text.splitlines()
  header = lines[0].split()
  assert header[:3] == ["H", "seeds", "failed"]
  assert len(lines) == 2 + 2 and lines[-1].startswith("[2 rows x ")
  for line, H, loss in zip(lines[1:3], final["H"],
                           final["final_eval_loss_mean"]):
    cells = line.split()
    assert cells[0] == str(H)
    assert float(cells[header.index("final_eval_loss_mean")]) == \
        pytest.approx(loss, rel=1e-5)
  assert len({len(l) for l in lines[:3]}) == 1  # aligned columns
  assert "pip install pandas" in str(study.table())


def test_with_pandas_the_tables_are_dataframes(small_study):
  pd = pytest.importorskip("pandas")
  study, _ = small_study
  assert isinstance(study.final(), pd.DataFrame)
  assert isinstance(study.table(), pd.DataFrame)


def test_pandas_is_in_the_dev_extras():
  import tomllib
  import pathlib
  root = pathlib.Path(__file__).parent.parent
  project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
  assert any(d.startswith("pandas") for d in
             project["optional-dependencies"]["dev"])


def _doc(name: str) -> str:
  import pathlib
  return (pathlib.Path(__file__).parent.parent / "docs" / name).read_text()


def test_data_doc_names_the_eval_keyword_python_takes():
  import inspect
  import numpy as np
  from lowbw import data
  row = next(l for l in _doc("data.md").splitlines() if "your arrays" in l)
  calls = re.findall(r"data\.arrays\(([^`]*)\)`", row)
  params = inspect.signature(data.arrays).parameters
  keywords = {k for c in calls for k in re.findall(r"(\w+)=", c)}
  assert keywords and keywords <= set(params), (keywords, row)
  assert "x_eval" not in params
  x = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
  y = np.arange(20) % 2
  data.arrays(x, y, eval=(x[:5], y[:5]))  # as the row says


def test_planner_doc_does_not_say_every_node_is_identical():
  text = _doc("planner.md")
  assert "All nodes are identical" not in text
  limits = text[text.index("## Limits"):]
  assert "`speeds`" in limits


def _corpus_folder(root):
  (root / "sub").mkdir(parents=True)
  for i in range(3):
    (root / f"doc{i}.md").write_text(f"# Title {i}\n\nmarkdown {i}\n")
    (root / "sub" / f"code{i}.py").write_text(f"print('code {i}')\n")
  return root


def test_include_keeps_the_folder_files_matching_a_glob(tmp_path):
  from lowbw.data import _corpus
  root = _corpus_folder(tmp_path / "c")
  docs = list(_corpus.documents(root, include=["*.md"])())
  assert sorted({d.source for d in docs}) == ["doc0.md", "doc1.md",
                                              "doc2.md"]
  by_path = list(_corpus.documents(root, include=("sub/*.py",))())
  assert sorted({d.source for d in by_path}) == [
      "sub/code0.py", "sub/code1.py", "sub/code2.py"]
  everything = {d.source for d in _corpus.documents(root)()}
  assert len(everything) == 6


def test_include_matching_nothing_says_what_the_folder_holds(tmp_path,
                                                            capsys):
  root = _corpus_folder(tmp_path / "c")
  assert cli.main(["data", "prepare", str(root), "--include", "*.rst",
                   "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "--include=['*.rst'] is invalid: matches no file" in err
  assert "*.md, *.py" in err


_RECORDS = [{"text": f"record {i} says something"} for i in range(4)]


@pytest.mark.parametrize("layout", ["list", "wrapped", "one", "lines"])
def test_a_json_file_is_one_document_or_json_lines(layout, tmp_path):
  import json
  from lowbw.data import _corpus
  path = tmp_path / "d.json"
  value = {"list": _RECORDS, "wrapped": {"data": _RECORDS},
           "one": _RECORDS[0]}.get(layout)
  path.write_text(json.dumps(value, indent=2) if value is not None else
                  "\n".join(json.dumps(r) for r in _RECORDS))
  texts = [d.text for d in _corpus.documents(path)()]
  expected = [_RECORDS[0]] if layout == "one" else _RECORDS
  assert texts == [r["text"] for r in expected]


def test_a_broken_json_file_says_what_is_expected(tmp_path):
  from lowbw.data import _corpus
  path = tmp_path / "d.json"
  path.write_text('{"text": "a",\n oops')
  with pytest.raises(ValueError, match="neither one JSON document .a list "
                     "of records, one record, or an object holding one list "
                     "of records. nor JSON Lines"):
    list(_corpus.documents(path)())


@pytest.fixture(scope="module")
def bench_figures():
  import optax
  from lowbw import bench, data, models, strategies
  inner = optax.adamw(1e-3)
  return bench.measure(models.mlp(hidden=(8,)), data.digits(),
                       strategies.diloco(inner, H=2), inner, workers=2,
                       batch_size=4,
                       timing=bench.Timing(rounds=1, repeats=3, warmup=1))


def _bench_rows(figures, efficiencies, marginal):
  """Two worker counts' rows with the given timed ratios and memory."""
  import statistics
  rows = []
  for w, ratios, run_bytes in ((1, efficiencies[0], 1e8),
                               (2, efficiencies[1], 1e8 + marginal)):
    rows.append(dict(figures, workers=w, efficiencies=ratios,
                     efficiency=statistics.median(ratios),
                     run_bytes=run_bytes))
  return rows


def _bench_out(monkeypatch, capsys, rows, *extra):
  from lowbw.cli import _bench
  it = iter(rows)
  monkeypatch.setattr(_bench, "_child", lambda s, w: dict(next(it)))
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", "--workers",
                   "1,2", "--H", "2", "--batch-size", "4", *extra])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return captured.out


def test_bench_explains_its_figures_and_marks_noise(bench_figures,
                                                    monkeypatch, capsys):
  steady = [0.25, 0.26, 0.25]  # spread 4% of the median
  shaky = [0.5, 0.8, 1.0]      # spread 71%
  out = _bench_out(monkeypatch, capsys,
                   _bench_rows(bench_figures, [steady, shaky], -3e6))
  table = [l.split(" | ") for l in out.splitlines() if " | " in l]
  head, w1, w2 = table
  e = head.index("efficiency")
  assert w1[e] == "0.250" and w2[e] == "0.800*"
  assert w2[head.index("MB/added worker")] == "-3.0*"
  assert "efficiency: the baseline's time over the simulator's" in out
  assert "well under 1 at W=1 is expected" in out
  assert "* noise: fewer than 3 timed calls, or their efficiencies spread " \
         "over 20% of the median" in out
  assert "negative MB/added worker is the allocator's" in out


def test_bench_with_few_repeats_marks_every_figure(bench_figures,
                                                   monkeypatch, capsys):
  rows = _bench_rows(bench_figures, [[0.3], [0.5]], 1e6)
  out = _bench_out(monkeypatch, capsys, rows, "--repeats", "1")
  table = [l.split(" | ") for l in out.splitlines() if " | " in l]
  e = table[0].index("efficiency")
  assert [r[e] for r in table[1:]] == ["0.300*", "0.500*"]
  assert "negative" not in out


def test_bench_json_is_a_flag_printing_to_stdout(bench_figures, monkeypatch,
                                                 capsys, tmp_path):
  import json
  rows = _bench_rows(bench_figures, [[0.3] * 3, [0.5] * 3], 1e6)
  out = tmp_path / "b.json"
  printed = json.loads(_bench_out(monkeypatch, capsys, rows, "--json",
                                  "--json-out", str(out)))
  assert [r["workers"] for r in printed["configurations"]] == [1, 2]
  assert json.loads(out.read_text()) == printed


def test_bench_json_with_a_file_says_to_use_json_out(capsys):
  assert cli.main(["bench", "--model", "mlp", "--json", "b.json"]) == 2
  err = capsys.readouterr().err
  assert err == ("lowbw: error: --json='b.json' is invalid: --json is a "
                 "flag: it prints the figures as JSON on stdout; write them "
                 "to a file with --json-out b.json\n")


def test_the_default_run_syncs_and_evaluates_about_ten_times():
  import lowbw
  c = lowbw.Config()
  assert c.steps // c.H >= 10 and c.steps // c.eval_every >= 10
  # Naming the strategy keeps its own default; explicit values are kept.
  assert lowbw.Config(strategy="diloco").H == 100
  assert lowbw.Config(H=50, eval_every=100).eval_every == 100


def test_the_default_picture_draws_loss_against_steps_and_time(
    tiny_run, monkeypatch):
  from lowbw.cli import _plot
  figs = []
  monkeypatch.setattr(_plot, "save", lambda fig, path: figs.append(fig))
  path, xs = _plot.learning_curves(str(tiny_run), 2)
  assert xs == ["step", "sim_time_s"] and path.endswith("plot.png")
  (fig,) = figs
  steps_ax, time_ax = fig.axes
  assert steps_ax.get_xlabel() == "step"
  assert time_ax.get_xlabel().startswith("simulated time")
  rows = _plot.read_metrics(str(tiny_run))
  labels = [l.get_label() for l in steps_ax.get_lines()]
  assert labels == ["train_loss, mean of 2 rows", "eval_loss"]
  # Every eval row is a point of the curve against steps.
  evals = [s for s, e in zip(rows["step"], rows["eval_loss"]) if e == e]
  assert list(steps_ax.get_lines()[1].get_xdata()) == evals
  assert len(evals) >= 2


class _FakeStudy:
  """What the study plots read: the final table, the swept names, seeds."""
  names = ["inner_lr"]
  seeds = [0]

  def __init__(self, lrs, wire, time_s):
    n = len(lrs)
    self.cols = {"inner_lr": lrs, "seeds": [1] * n, "failed": [0] * n,
                 "final_eval_loss_mean": [2.0 + 0.01 * i for i in range(n)],
                 "final_eval_loss_std": [0.0] * n,
                 "wire_bytes_mean": wire, "wire_bytes_std": [0.0] * n,
                 "sim_time_s_mean": time_s, "sim_time_s_std": [0.0] * n}

  def final(self, frame=True):
    return self.cols


@pytest.mark.parametrize("lrs, wire, time_s", [
    ([1e-4 + 1.3e-5 * i for i in range(12)],
     [123456789.0 + 1234.0 * i for i in range(12)],
     [1234.5 + 0.37 * i for i in range(12)]),
    ([0.001, 0.002, 0.003], [1e6, 2e6, 3e6], [10.0, 20.0, 30.0]),
])
def test_study_plot_ticks_are_few_distinct_and_their_own_values(
    lrs, wire, time_s, monkeypatch, tmp_path):
  pytest.importorskip("matplotlib")
  from lowbw.studies import _plots
  figs = []
  monkeypatch.setattr(_plots._axes, "save_figure",
                      lambda fig, path: figs.append(fig))
  _plots.draw(_FakeStudy(lrs, wire, time_s), str(tmp_path))
  assert len(figs) == 3
  for fig in figs:
    fig.canvas.draw()
    (ax,) = fig.axes
    lo, hi = ax.get_xlim()
    ticks = [(t.get_position()[0], t) for t in ax.get_xticklabels()
             if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert 2 <= len(ticks) <= 6
    texts = [t.get_text() for _, t in ticks]
    assert len(set(texts)) == len(texts), texts
    locs = [x for x, _ in ticks]
    gap = min(b - a for a, b in zip(locs, locs[1:]))
    for x, text in zip(locs, texts):  # no hidden offset or factor
      assert abs(float(text.replace("\u2212", "-")) - x) < gap / 2, (x, text)
    boxes = [t.get_window_extent() for _, t in ticks]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), texts


# The default GPT run steps its workers one at a time (a memory plan's
# ``worker_batch``): a loop of its own, whose rows need the rate as well.
@pytest.mark.parametrize("groups", [[], ["--worker-batch", "1"]],
                         ids=["all_workers", "in_groups"])
def test_the_lr_column_shows_every_row_from_the_first(tmp_path, groups):
  import csv
  peak, warmup = 0.01, 8
  assert cli.main(_TINY[:-4] + groups + ["--steps", "12", "--H", "5",
                                "--warmup-steps", str(warmup),
                                "--inner-lr", str(peak), "--no-progress",
                                "--no-plot", "--out", str(tmp_path / "r")]) == 0
  with open(tmp_path / "r" / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["step"]) for r in rows] == list(range(1, 13))
  for r in rows:  # each step's rate: linear warm-up from 0, then the peak
    s = int(r["step"])
    assert float(r["lr"]) == pytest.approx(peak * min(1, (s - 1) / warmup),
                                           rel=1e-5, abs=1e-9)


def test_a_study_evaluates_enough_for_a_curve_by_default(small_study):
  import numpy as np
  study, _ = small_study
  for p in study.points:  # 8 steps: at every sync (the tenth of 8 is 1)
    evals = np.isfinite(p.history["eval_loss"]).sum()
    assert evals == _STUDY["steps"] // p.values["H"] >= 2
    assert p.config.eval_every == p.values["H"]


def test_an_explicit_eval_every_is_kept():
  import lowbw
  assert lowbw.Config(**_STUDY, H=2, eval_every=8).eval_every == 8
  long = lowbw.Config(data="digits", H=10, steps=5000)
  assert long.eval_every == 100  # 50 evaluations: no more than before


@pytest.mark.parametrize("fraction,text", [
    (0.0, "0.0%"), (1.0, "100.0%"), (0.25, "25.0%"), (0.001, "0.1%"),
    (0.0000833, "0.0083%"), (0.0005, "0.05%"), (0.9999167, "99.9917%"),
    (0.9995, "99.950%")])
def test_a_share_never_reads_zero_or_all_unless_it_is(fraction, text):
  # The default run's goodput (about 1e-4: an H100 computes this model's
  # step in microseconds while each sync waits 14 hops of 50 ms) printed
  # as "0.0%", and its communication share as "100.0%".
  assert _train.share(fraction) == text


@pytest.mark.parametrize("hardware,text", [
    ("h100", "h100 at MFU 0.4"),
    ("0.01s", "0.01s per step (given; no MFU applies)")])
def test_the_summary_names_mfu_only_where_it_applies(hardware, text):
  assert _train._hardware_text({"hardware": hardware, "mfu": 0.4}) == text


def test_off_a_terminal_the_sweep_command_says_each_point_once(
    tmp_path, capsys):
  argv = ["sweep", "--data", "digits", "--hidden", "8", "--workers", "2",
          "--steps", "4", "--batch-size", "4", "--eval-examples", "16",
          "--grid", "H=2,4", "--out", str(tmp_path / "s")]
  assert cli.main(argv) == 0  # progress unset, stdout captured: no terminal
  lines = capsys.readouterr().out.splitlines()
  said = [line for line in lines
          if line.startswith(("point ", "study: point"))]
  assert [line.split(" (")[0] for line in said] == [
      "study: point 1/2 done", "study: point 2/2 done"], lines
  assert cli.main(argv[:-2] + ["--out", str(tmp_path / "q"),
                               "--no-progress"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert sorted(line.split(":")[0] for line in lines
                if line.startswith(("point ", "study: point"))) == [
      "point 0", "point 1"], lines
