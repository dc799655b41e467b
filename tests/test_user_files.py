"""Files and folders users hand to lowbw: readers refuse what they do not
understand with one line naming the file (or flag), what is there and what
is allowed; no path read from a user's file leads out of its folder."""

import json
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest

from lowbw import cli, data
from lowbw.data import _prepare, _tokenizer


def error_of(argv, capsys) -> str:
  """The one-line error of a command that must fail before it trains."""
  code = cli.main(argv)
  err = capsys.readouterr().err.strip()
  assert code == 2, err
  assert len(err.splitlines()) == 1 and err.startswith("lowbw: error: "), err
  return err


# --- paths: a missing one, a folder, a device ------------------------------

def test_a_missing_data_folder_is_named_before_any_model_flag(capsys):
  err = error_of(["train", "--data", "/no/such/folder", "--layers", "1"],
                 capsys)
  assert "--data='/no/such/folder' is invalid: no such file or folder" in err


@pytest.mark.parametrize("path, why", [
    ("FOLDER", "is a folder; expected a YAML, TOML or JSON file"),
    ("/dev/null", "is not a regular file"),
    ("/no/such.toml", "no such file")])
def test_a_config_that_is_a_folder_or_a_device_is_not_no_such_file(
    tmp_path, capsys, path, why):
  path = str(tmp_path) if path == "FOLDER" else path
  err = error_of(["train", "--config", path], capsys)
  assert f"--config={path!r} is invalid: {why}" in err


def test_a_folder_named_like_an_archive_is_one_error_naming_data(
    tmp_path, capsys):
  folder = tmp_path / "x.npz"
  folder.mkdir()
  err = error_of(["train", "--data", str(folder)], capsys)
  assert f"--data={str(folder)!r} is invalid: expected at least one" in err
  assert "root=" not in err


def test_a_tokenizer_that_is_a_folder_is_named(tmp_path, capsys):
  (tmp_path / "a.txt").write_text("some text\n\nmore text\n")
  err = error_of(["data", "prepare", str(tmp_path / "a.txt"), "--out",
                  str(tmp_path / "out"), "--tokenizer", str(tmp_path)],
                 capsys)
  assert f"--tokenizer={str(tmp_path)!r} is invalid: is a folder" in err


# --- prepared folders: meta.json is read, checked and kept to its folder ---

STORY = ("The little robot rolled into the garden. It saw a red flower and "
         "a blue bird. The bird sang a song and the robot listened.")


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("prepared")
  corpus = root / "stories.txt"
  corpus.write_text("\n\n".join(f"{STORY} Day {i}." for i in range(40)))
  data.prepare(corpus, root / "data", vocab_size=300)
  return root / "data"


def variant(prepared_dir, tmp_path, **meta_changes):
  """A copy of the prepared folder with meta.json's keys changed (None:
  removed)."""
  out = tmp_path / "variant"
  shutil.copytree(prepared_dir, out)
  meta = json.loads((out / "meta.json").read_text())
  for key, value in meta_changes.items():
    if value is None:
      meta.pop(key)
    else:
      meta[key] = value
  (out / "meta.json").write_text(json.dumps(meta))
  return out


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd",
                                  "../stories.txt"])
def test_a_tokenizer_path_out_of_the_folder_is_refused(prepared_dir,
                                                       tmp_path, name):
  folder = variant(prepared_dir, tmp_path, tokenizer=name)
  with pytest.raises(ValueError, match="leads out of the folder"):
    data.prepared(folder, seq_len=16)


def test_a_tokenizer_linked_from_elsewhere_is_refused(prepared_dir,
                                                      tmp_path):
  folder = variant(prepared_dir, tmp_path)
  outside = tmp_path / "elsewhere.json"
  shutil.copy(folder / "tokenizer.json", outside)
  (folder / "tokenizer.json").unlink()
  (folder / "tokenizer.json").symlink_to(outside)
  with pytest.raises(ValueError, match="leads out of the folder"):
    data.prepared(folder, seq_len=16)


def test_a_tokenizer_in_a_subfolder_is_its_own_file(prepared_dir, tmp_path):
  folder = variant(prepared_dir, tmp_path, tokenizer="tok/tokenizer.json")
  (folder / "tok").mkdir()
  shutil.move(folder / "tokenizer.json", folder / "tok" / "tokenizer.json")
  source = data.prepared(folder, seq_len=16)
  assert source.tokenizer == os.path.join(folder, "tok", "tokenizer.json")


def test_a_train_run_never_copies_a_file_from_outside(prepared_dir, tmp_path,
                                                      capsys):
  secret = tmp_path / "secret.json"
  secret.write_text("not yours")
  folder = variant(prepared_dir, tmp_path, tokenizer="../secret.json")
  err = error_of(["train", "--data", str(folder), "--out",
                  str(tmp_path / "run"), "--steps", "4", "--H", "2"], capsys)
  assert "tokenizer '../secret.json' leads out of the folder" in err
  assert not (tmp_path / "run").exists()


def test_uint32_tokens_are_read_as_uint32(prepared_dir, tmp_path):
  folder = variant(prepared_dir, tmp_path, dtype="uint32")
  expected = {}
  for split in ("train", "val"):
    ids = np.fromfile(prepared_dir / f"{split}.bin", "<u2")
    ids.astype("<u4").tofile(folder / f"{split}.bin")
    expected[split] = ids
  source = data.prepared(folder, seq_len=16)
  np.testing.assert_array_equal(source.train["tokens"], expected["train"])
  np.testing.assert_array_equal(source.eval["tokens"], expected["val"])


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": None}, "its meta.json has no vocab_size"),
    ({"vocab_size": "300"}, "its meta.json vocab_size is '300'"),
    ({"dtype": "int64"}, "its meta.json's dtype is 'int64'; expected one of"),
    ({"tokenizer": None}, "its meta.json's tokenizer is None"),
    ({"tokenizer": "nothing.json"}, "'nothing.json' is not a file"),
    ({"version": "1"}, "is not a lowbw-tokens version"),
    ({"dtype": "uint32"}, "not a whole number of uint32 tokens"),
])
def test_meta_json_variants_are_one_line_errors(prepared_dir, tmp_path,
                                                capsys, change, message):
  folder = variant(prepared_dir, tmp_path, **change)
  if change == {"dtype": "uint32"}:  # 4-byte tokens in a file of 2-byte ones
    with open(folder / "train.bin", "ab") as f:
      f.write(b"\0\0")
  err = error_of(["train", "--data", str(folder)], capsys)
  assert f"--data={str(folder)!r} is invalid: " in err and message in err


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "holds a JSON list; expected an object"),
    ("{", "is not readable JSON"),
    ("\xff\xfe", "is not readable JSON")])
def test_meta_json_that_is_not_an_object_is_named(prepared_dir, tmp_path,
                                                  capsys, text, message):
  folder = variant(prepared_dir, tmp_path)
  (folder / "meta.json").write_bytes(text.encode("latin-1"))
  err = error_of(["train", "--data", str(folder)], capsys)
  assert "its meta.json " + message in err


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_ids_beyond_the_vocabulary_are_refused(prepared_dir, tmp_path,
                                                     split):
  folder = variant(prepared_dir, tmp_path)
  ids = np.fromfile(folder / f"{split}.bin", "<u2")
  ids[7] = 300  # the vocabulary is 0..299
  ids.tofile(folder / f"{split}.bin")
  with pytest.raises(ValueError, match=rf"its {split}.bin holds token id "
                     r"300 \(token 7\); its meta.json's vocab_size is 300"):
    data.prepared(folder, seq_len=16)


def test_a_vocabulary_smaller_than_the_tokens_names_the_folder(
    prepared_dir, tmp_path, capsys):
  folder = variant(prepared_dir, tmp_path, vocab_size=10)
  err = error_of(["train", "--data", str(folder)], capsys)
  assert "vocab_size is 10, so ids must lie in [0, 10)" in err
  assert "vocab=" not in err


@pytest.mark.parametrize("name", ["train_docs.npy", "train_sources.npy"])
def test_a_missing_or_broken_document_index_is_named(prepared_dir, tmp_path,
                                                     name):
  folder = variant(prepared_dir, tmp_path)
  (folder / name).write_bytes(b"garbage")
  with pytest.raises(ValueError, match=f"its {name} is not a readable"):
    data.prepared(folder, seq_len=16)
  (folder / name).unlink()
  with pytest.raises(ValueError, match=f"its {name} is missing"):
    data.prepared(folder, seq_len=16)


# --- data prepare: what is not text is refused, naming the file -----------

def idx(path, array: np.ndarray) -> None:
  header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
  header += struct.pack(f">{array.ndim}I", *array.shape)
  path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_folder(root):
  root.mkdir()
  rng = np.random.default_rng(0)
  for name, n in (("train", 30), ("t10k", 10)):
    idx(root / f"{name}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
    idx(root / f"{name}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
  return root


def prepare_error(source, tmp_path, capsys, *flags) -> str:
  return error_of(["data", "prepare", str(source), "--out",
                   str(tmp_path / "out"), "--no-progress", *flags], capsys)


def test_an_mnist_folder_is_refused_and_pointed_to_train(tmp_path, capsys):
  folder = mnist_folder(tmp_path / "mnist")
  err = prepare_error(folder, tmp_path, capsys)
  assert "holds MNIST / Fashion-MNIST images (IDX files), not text" in err
  assert f"lowbw train --data {folder}" in err
  assert not (tmp_path / "out").exists()


def test_one_idx_file_is_refused_by_name(tmp_path, capsys):
  folder = mnist_folder(tmp_path / "mnist")
  file = folder / "train-labels-idx1-ubyte"
  err = prepare_error(file, tmp_path, capsys)
  assert f"source={str(file)!r} is invalid: is an IDX file" in err


def test_a_binary_file_among_text_files_is_named(tmp_path, capsys):
  folder = tmp_path / "corpus"
  folder.mkdir()
  (folder / "a.txt").write_text("Some text.\n\nMore text.\n")
  (folder / "weights").write_bytes(np.arange(500, dtype=np.float32).tobytes())
  err = prepare_error(folder, tmp_path, capsys)
  assert f"source={str(folder / 'weights')!r} is invalid: is binary" in err


@pytest.mark.parametrize("kind", ["zip", "gzip"])
def test_archives_are_refused_not_read_as_text(tmp_path, capsys, kind):
  text = "\n\n".join(f"{STORY} Day {i}." for i in range(40))
  if kind == "zip":
    path = tmp_path / "corpus.zip"
    with zipfile.ZipFile(path, "w") as z:  # stored: the text is visible
      z.writestr("corpus.txt", text)
  else:
    import gzip
    path = tmp_path / "corpus.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
  err = prepare_error(path, tmp_path, capsys)
  assert f"source={str(path)!r} is invalid: is " in err
  assert "not text; unpack it" in err


def test_a_device_is_not_a_corpus(tmp_path, capsys):
  err = prepare_error("/dev/null", tmp_path, capsys)
  assert "source='/dev/null' is invalid: is not a regular file" in err


def test_latin1_text_is_still_text(tmp_path):
  path = tmp_path / "latin.txt"
  path.write_bytes("\n\n".join(f"Caf\xe9 na\xefve r\xe9sum\xe9 {i}." * 20
                               for i in range(30)).encode("latin-1"))
  meta = data.prepare(path, tmp_path / "out", vocab_size=300)
  assert meta["train"]["documents"] + meta["val"]["documents"] == 30


def test_an_empty_source_says_it_holds_no_text(tmp_path, capsys):
  (tmp_path / "empty.txt").write_text("\n\n  \n")
  err = prepare_error(tmp_path / "empty.txt", tmp_path, capsys)
  assert "the source holds no text" in err and "val_fraction" not in err


def test_one_long_line_is_refused_before_a_tokenizer_is_trained(
    tmp_path, monkeypatch):
  path = tmp_path / "long.txt"
  path.write_text("a" * 100_000)

  def never(*args, **kwargs):
    raise AssertionError("trained a tokenizer for a corpus it then refused")

  monkeypatch.setattr(_tokenizer, "train_bpe", never)
  with pytest.raises(ValueError, match="the val split is empty"):
    data.prepare(path, tmp_path / "out")


def test_bpe_cuts_runs_without_spaces_and_keeps_ordinary_words(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  texts = [f"{STORY} Day {i}." for i in range(40)]
  ours = _tokenizer.train_bpe(texts + ["b" * 5_000], 400)
  pieces = ours.pre_tokenizer.pre_tokenize_str("x " + "b" * 1_000)
  assert max(len(p) for p, _ in pieces) <= _tokenizer.MAX_PIECE
  assert "".join(p for p, _ in pieces) == "xĠ" + "b" * 1_000  # nothing lost
  # The reference: the plain byte-level BPE, which never cuts a word.
  plain = Tokenizer(models.BPE())
  plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  plain.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=400, special_tokens=[_tokenizer.EOS], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  cut = _tokenizer.train_bpe(texts, 400)
  for text in texts[:5]:
    assert cut.encode(text).ids == plain.encode(text).ids
  long = "b" * 1_000
  assert ours.decode(ours.encode(long).ids) == long


def test_a_corrupt_parquet_and_a_non_utf8_jsonl_are_named(tmp_path,
                                                          capsys):
  pytest.importorskip("pyarrow")
  bad = tmp_path / "bad.parquet"
  bad.write_bytes(b"PAR1 not really a parquet file")
  err = prepare_error(bad, tmp_path, capsys)
  assert f"source={str(bad)!r} is invalid: is not a readable Parquet" in err
  jsonl = tmp_path / "bad.jsonl"
  jsonl.write_bytes(b'{"text": "caf\xe9"}\n')
  err = prepare_error(jsonl, tmp_path, capsys)
  assert f"source={str(jsonl)!r} is invalid: is not UTF-8 text" in err


def test_a_parquet_without_the_text_column_names_the_flag(tmp_path, capsys):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  path = tmp_path / "c.parquet"
  pq.write_table(pa.table({"body": ["some text"] * 4}), path)
  err = prepare_error(path, tmp_path, capsys)
  assert "--text-column='text' is invalid: c.parquet has no such column" in err


# --- lowbw eval and generate on a classifier's run -------------------------

@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
  run = tmp_path_factory.mktemp("classifier") / "run"
  assert cli.main(["train", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--batch-size", "4", "--steps", "4", "--H", "2",
                   "--no-progress", "--no-plot", "--out", str(run)]) == 0
  return run


def digits_like(path, x, y):
  np.savez(path, x=x, y=y, x_eval=x, y_eval=y)
  return str(path)


def test_eval_refuses_labels_beyond_the_models_classes(classifier_run,
                                                       tmp_path, capsys):
  x = np.random.default_rng(0).random((20, 8, 8, 1), np.float32)
  spec = digits_like(tmp_path / "labels.npz", x, np.arange(20))
  err = error_of(["eval", str(classifier_run), "--data", spec], capsys)
  assert f"--data={spec!r} is invalid: has class label 19; the run's model " \
         "has 10 classes" in err
  ok = digits_like(tmp_path / "ok.npz", x, np.arange(20) % 10)
  assert cli.main(["eval", str(classifier_run), "--data", ok, "--json"]) == 0
  assert np.isfinite(json.loads(capsys.readouterr().out)["eval_loss"])


def test_eval_refuses_examples_of_another_width(classifier_run, tmp_path,
                                                capsys):
  x = np.ones((20, 5), np.float32)
  spec = digits_like(tmp_path / "wide.npz", x, np.arange(20) % 10)
  err = error_of(["eval", str(classifier_run), "--data", spec], capsys)
  assert f"--data={spec!r} is invalid: has examples shaped (5,), which the " \
         "run's model does not take" in err


def test_eval_never_reports_a_nan_loss_as_a_result(classifier_run, tmp_path,
                                                   capsys):
  copy = tmp_path / "run"
  shutil.copytree(classifier_run, copy)
  with np.load(copy / "params.npz") as saved:
    params = {k: np.full_like(saved[k], np.nan) for k in saved.files}
  np.savez(copy / "params.npz", **params)
  err = error_of(["eval", str(copy), "--data", "digits"], capsys)
  assert "--data='digits' is invalid: gives eval_" in err and "nan" in err


@pytest.mark.parametrize("damage, message", [
    ("config_text", "its config.json is not readable JSON"),
    ("config_list", "its config.json holds a JSON list"),
    ("params", "its params.npz is not a readable .npz")])
def test_a_damaged_run_folder_is_named(classifier_run, tmp_path, capsys,
                                       damage, message):
  copy = tmp_path / "run"
  shutil.copytree(classifier_run, copy)
  if damage == "config_text":
    (copy / "config.json").write_text('{"model": ')
  elif damage == "config_list":
    (copy / "config.json").write_text("[]")
  else:
    (copy / "params.npz").write_bytes(b"PK\x03\x04 cut short")
  err = error_of(["eval", str(copy), "--data", "digits"], capsys)
  assert f"run_dir={str(copy)!r} is invalid: {message}" in err


def test_a_run_dir_that_is_a_device_is_not_a_folder(capsys):
  err = error_of(["eval", "/dev/null", "--data", "digits"], capsys)
  assert "run_dir='/dev/null' is invalid: is not a folder" in err


def test_a_prepared_tokenizer_is_read_when_the_folder_is_opened(
    prepared_dir, tmp_path):
  folder = variant(prepared_dir, tmp_path)
  (folder / "tokenizer.json").write_text("not a tokenizer")
  with pytest.raises(ValueError, match="its tokenizer .*tokenizer.json: "
                     "expected a tokenizer.json of the tokenizers library"):
    data.prepared(folder, seq_len=16)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(prepared_dir,
                                                          tmp_path):
  folder = variant(prepared_dir, tmp_path, vocab_size=299)
  ids = np.fromfile(prepared_dir / "train.bin", "<u2")
  for split in ("train", "val"):  # ids below 299, so only the size is off
    np.minimum(ids, 298).astype("<u2").tofile(folder / f"{split}.bin")
  with pytest.raises(ValueError, match="its tokenizer has 300 ids; its "
                     "meta.json's vocab_size is 299"):
    data.prepared(folder, seq_len=16)


def test_an_empty_token_split_is_said_in_tokens(prepared_dir, tmp_path,
                                                capsys):
  folder = variant(prepared_dir, tmp_path)
  (folder / "train.bin").write_bytes(b"")
  err = error_of(["train", "--data", str(folder)], capsys)
  assert "its train.bin holds 0 tokens; expected at least" in err
  assert "groups" not in err


def test_eval_examples_is_named_as_its_flag(classifier_run, capsys):
  err = error_of(["eval", str(classifier_run), "--data", "digits",
                  "--eval-examples", "0"], capsys)
  assert "--eval-examples=0 is invalid" in err


def test_plot_names_a_metrics_file_that_is_not_text(tmp_path, capsys):
  (tmp_path / "metrics.csv").write_bytes(b"\x00\xffnot,a\ncsv")
  err = error_of(["plot", str(tmp_path), "--out", str(tmp_path / "p.png")],
                 capsys)
  assert f"{tmp_path / 'metrics.csv'} is not a readable CSV file" in err


@pytest.mark.parametrize("what", ["empty folder", "/dev/null"])
def test_data_that_is_an_empty_folder_or_a_device_is_named_first(
    tmp_path, capsys, what):
  path = str(tmp_path) if what == "empty folder" else what
  err = error_of(["train", "--data", path, "--hidden", "8"], capsys)
  assert f"--data={path!r} is invalid: is " in err


def test_the_bad_inputs_benchmark_counts_a_silent_nan_as_a_defect():
  import importlib.util
  path = os.path.join(os.path.dirname(__file__), "..", "benchmarks",
                      "bad_inputs.py")
  spec = importlib.util.spec_from_file_location("bad_inputs", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert bench._non_finite({"final_eval_loss": None}) is not None  # NaN
  assert bench._non_finite({"sim_time_s": float("inf")}) is not None
  assert bench._non_finite({"final_eval_loss": 2.3, "sim_time_s": 1.0,
                            "diverged_at_step": None}) is None
  assert bench._NAN_WORD.search("eval_loss nan, eval_accuracy 0.1")
  assert bench._NAN_WORD.search('"eval_loss": NaN')
  assert not bench._NAN_WORD.search("a banana, finance, infinite nanny")
  assert "silent nan" in bench.DEFECTS


def test_a_text_folder_says_which_files_it_skips_as_not_utf8(tmp_path,
                                                            capsys):
  # Files that do not decode are left out of the corpus: never unsaid (every
  # run on it lists them among its warnings), and a single such file given
  # as the corpus is refused, naming it.
  from lowbw import data as data_lib
  folder = tmp_path / "corpus"
  folder.mkdir()
  (folder / "a.txt").write_text("plain text, " * 40)
  (folder / "b.bin").write_bytes(bytes(range(128, 256)) * 4)
  source = data_lib.text_bytes(seq_len=8, root=folder)
  note = (f"the text under {folder} left out 1 file(s) that are not UTF-8 "
          "text (e.g. b.bin)")
  assert source.notes == (note,)
  with pytest.raises(ValueError, match=r"^root=.*b\.bin.* is not UTF-8 text"):
    data_lib.text_bytes(seq_len=8, root=folder / "b.bin")
  out = tmp_path / "run"
  assert cli.main(["train", "--data", "text", "--data-root", str(folder),
                   "--layers", "1", "--d-model", "8", "--heads", "1",
                   "--seq-len", "8", "--workers", "2", "--batch-size", "2",
                   "--steps", "2", "--H", "1", "--eval-every", "2",
                   "--no-progress", "--no-plot", "--out", str(out)]) == 0
  assert note in json.loads((out / "summary.json").read_text())["warnings"]
  assert note in capsys.readouterr().err
