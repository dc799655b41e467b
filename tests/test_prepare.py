"""``lowbw data prepare`` and ``data.prepared``: a local corpus into token
files (byte-level BPE, a split by document, sources), read back for
training, with non-IID sharding by source."""

import json
import os

import numpy as np
import pytest

from lowbw import cli, data
from lowbw.data import _corpus, _prepared, _tokenizer

# Unicode, punctuation, code, whitespace runs: what a byte-level BPE must
# round-trip exactly.
TEXTS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler",
    "Ünïcödé — ümlauts, émojis 🙂 and CJK 漢字 in one line.\t\ttabs",
    "def f(x):\n    return x ** 2  # code, with   spaces\n",
    "Numbers 3.14159 and 2,718; symbols <|> {} [] @#$%^&*",
] + [f"Story {i}: the cat sat on mat number {i} and then it ran away "
     f"{'far ' * (i % 5)}to the hills." for i in range(60)]


def _doc_texts(out: str, split: str) -> list[str]:
  tok = _tokenizer.BPE(_tokenizer.load(os.path.join(out, "tokenizer.json")))
  tokens = np.fromfile(os.path.join(out, f"{split}.bin"), np.uint16)
  offsets = np.load(os.path.join(out, f"{split}_docs.npy"))
  eos = tok.tokenizer.token_to_id(_tokenizer.EOS)
  docs = []
  for a, b in zip(offsets[:-1], offsets[1:]):
    assert tokens[b - 1] == eos  # every document ends with end-of-text
    docs.append(tok.decode_ids(tokens[a:b - 1]))
  return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  path = root / "corpus.txt"
  path.write_text("\n\n".join(TEXTS), encoding="utf-8")
  out = root / "prepared"
  meta = data.prepare(path, out, vocab_size=320, val_fraction=0.2, seed=3)
  return path, out, meta


def test_bpe_trained_on_the_fixture_round_trips_it_exactly():
  tok = _tokenizer.BPE(_tokenizer.train_bpe(TEXTS, vocab_size=300))
  assert tok.vocab_size() == 300
  for text in TEXTS + ["unseen: ☃ \x00 \r\n ЖЖ"]:
    ids = tok.encode_ids(text)
    assert max(ids) < 300
    assert tok.decode_ids(ids) == text
  # Merges were learned: the corpus takes fewer tokens than bytes.
  joined = "\n\n".join(TEXTS)
  assert len(tok.encode_ids(joined)) < 0.7 * len(joined.encode())


def test_documents_are_split_whole_and_every_one_is_kept(corpus):
  _, out, meta = corpus
  train, val = _doc_texts(out, "train"), _doc_texts(out, "val")
  # No document cut or lost (paragraphs lose their surrounding newlines).
  assert sorted(train + val) == sorted(t.strip("\n") for t in TEXTS)
  assert meta["train"]["documents"] == len(train) == len(TEXTS) - len(val)
  # A corpus this small (5 KB) holds out more than its draw, up to half its
  # text, so that validation has windows to score.
  held = sum(len(t.encode()) for t in val)
  assert 0 < len(val) < len(TEXTS) and held <= len(
      "\n\n".join(TEXTS).encode()) / 2
  assert meta["vocab_size"] == 320 and meta["sources"] == ["corpus.txt"]
  size = os.path.getsize(os.path.join(out, "train.bin"))
  assert size == 2 * meta["train"]["tokens"]


def test_same_seed_same_bits_another_seed_another_split(corpus, tmp_path):
  path, out, _ = corpus
  again = data.prepare(path, tmp_path / "a", vocab_size=320,
                       val_fraction=0.2, seed=3)
  for name in ("train.bin", "val.bin", "tokenizer.json"):
    with open(out / name, "rb") as f, open(tmp_path / "a" / name, "rb") as g:
      assert f.read() == g.read(), name
  assert again["val"] == json.loads((out / "meta.json").read_text())["val"]
  data.prepare(path, tmp_path / "b", vocab_size=320, val_fraction=0.2,
               seed=4)
  assert _doc_texts(tmp_path / "b", "val") != _doc_texts(out, "val")


def test_a_given_tokenizer_is_used_as_is(corpus, tmp_path):
  path, out, _ = corpus
  data.prepare(path, tmp_path / "t", tokenizer=str(out / "tokenizer.json"),
               val_fraction=0.2, seed=3)
  for name in ("train.bin", "val.bin"):
    assert (out / name).read_bytes() == (tmp_path / "t" / name).read_bytes()


def test_the_prepared_folder_trains_as_memory_mapped_windows(corpus):
  _, out, meta = corpus
  source = data.prepared(out, seq_len=8)
  assert isinstance(source.train["tokens"], np.memmap)
  assert source.vocab_size == 320 and source.task == "lm"
  assert source.num_examples() == (meta["train"]["tokens"] - 1) // 8
  assert source.tokenizer == os.path.join(out, "tokenizer.json")
  sampler = source.build(num_workers=2, batch_size=4, seed=0)
  assert sampler.shard_idx_W.shape[0] == 2
  assert data.get(**source.config).num_examples() == source.num_examples()


def _jsonl_corpus(root):
  rows = [{"text": f"{topic} document {i}: " + f"{topic} words " * 30,
           "topic": topic}
          for topic in ("cats", "ships", "stars", "bread")
          for i in range(12)]
  path = root / "docs.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path, rows


def test_sources_from_a_metadata_column_shard_text_by_source(tmp_path):
  path, _ = _jsonl_corpus(tmp_path)
  meta = data.prepare(path, tmp_path / "out", vocab_size=300,
                      source_column="topic", val_fraction=0.1)
  assert meta["sources"] == ["cats", "ships", "stars", "bread"]
  source = data.prepared(tmp_path / "out", seq_len=16, sharding="source")
  sampler = source.build(num_workers=2, batch_size=2, seed=0)
  idx, lengths = np.asarray(sampler.shard_idx_W), np.asarray(
      sampler.shard_len_W)
  seen = [set(source.groups[idx[w, :lengths[w]]].tolist()) for w in range(2)]
  assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {0, 1, 2, 3}
  # Every window is owned once; a window's source is its first token's doc.
  owned = np.concatenate([idx[w, :lengths[w]] for w in range(2)])
  assert sorted(owned.tolist()) == list(range(source.num_examples()))


def test_dirichlet_over_sources_skews_each_worker(tmp_path):
  path, _ = _jsonl_corpus(tmp_path)
  data.prepare(path, tmp_path / "out", vocab_size=300,
               source_column="topic", val_fraction=0.1)
  source = data.prepared(tmp_path / "out", seq_len=16, sharding="dirichlet",
                         alpha=0.1)
  sampler = source.build(num_workers=2, batch_size=1, seed=0)
  idx, lengths = np.asarray(sampler.shard_idx_W), np.asarray(
      sampler.shard_len_W)
  shares = [np.bincount(source.groups[idx[w, :lengths[w]]], minlength=4)
            / lengths[w] for w in range(2)]
  # With alpha 0.1 the two workers' source mixes differ a lot.
  assert np.abs(shares[0] - shares[1]).sum() > 0.5


def test_parquet_and_a_saved_arrow_dataset_read_like_jsonl(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  _, rows = _jsonl_corpus(tmp_path)
  table = pa.table({"text": [r["text"] for r in rows],
                    "topic": [r["topic"] for r in rows]})
  pq.write_table(table, tmp_path / "docs.parquet")
  saved = tmp_path / "saved"  # save_to_disk's layout: an Arrow stream
  saved.mkdir()
  with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as f:
    with pa.ipc.new_stream(f, table.schema) as writer:
      writer.write_table(table)
  (saved / "dataset_info.json").write_text("{}")
  (saved / "state.json").write_text("{}")
  for path in (tmp_path / "docs.parquet", saved):
    docs = list(_corpus.documents(path, source_column="topic")())
    assert [d.text for d in docs] == [r["text"] for r in rows]
    assert [d.source for d in docs] == [r["topic"] for r in rows]


def test_the_tinystories_recipe_uses_its_own_validation_file(tmp_path):
  stories = [f"Once upon a time there was a {w} who liked {w}s." * 3
             for w in ("dog", "frog", "log", "cog", "bog", "hog")]
  (tmp_path / "TinyStoriesV2-GPT4-train.txt").write_text(
      "\n<|endoftext|>\n".join(stories[:4]))
  (tmp_path / "TinyStoriesV2-GPT4-valid.txt").write_text(
      "\n<|endoftext|>\n".join(stories[4:]))
  meta = data.prepare(tmp_path, tmp_path / "out", recipe_name="tinystories",
                      vocab_size=300)
  assert meta["train"]["documents"] == 4 and meta["val"]["documents"] == 2
  assert _doc_texts(tmp_path / "out", "val") == stories[4:]
  assert meta["settings"]["recipe"] == "tinystories"


def test_the_cli_prepares_and_reports(tmp_path, capsys):
  path, _ = _jsonl_corpus(tmp_path)
  code = cli.main(["data", "prepare", str(path), "--out",
                   str(tmp_path / "out"), "--vocab-size", "300",
                   "--no-progress"])
  assert code == 0
  assert "vocabulary 300" in capsys.readouterr().out
  assert _prepared.is_prepared(tmp_path / "out")


@pytest.mark.parametrize("argv, flag, words", [
    (["--vocab-size", "100"], "--vocab-size=100", "257"),
    (["--val-fraction", "1"], "--val-fraction=1", "(0, 1)"),
    (["--split-on", "file"], "source=", "val split is empty"),
    (["--text-column", "body"], "--text-column='body'", "record 0"),
])
def test_bad_settings_are_one_line_errors(tmp_path, capsys, argv, flag,
                                          words):
  path, _ = _jsonl_corpus(tmp_path)
  if "--split-on" in argv:  # one document: nothing to hold out
    path = tmp_path / "one.txt"
    path.write_text("line one\nline two\nline three\n")
  code = cli.main(["data", "prepare", str(path), "--out",
                   str(tmp_path / "out")] + argv)
  err = capsys.readouterr().err
  assert code == 2 and flag in err and words in err, err
  assert not (tmp_path / "out" / "meta.json").exists()


def test_a_prepared_folder_is_not_overwritten_unasked(corpus, capsys):
  path, out, _ = corpus
  code = cli.main(["data", "prepare", str(path), "--out", str(out)])
  assert code == 2 and "--overwrite" in capsys.readouterr().err


def test_a_missing_source_and_a_bad_jsonl_line_are_named(tmp_path):
  with pytest.raises(ValueError, match="no such file or folder"):
    data.prepare(tmp_path / "nope", tmp_path / "out")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "fine"}\n{not json\n')
  with pytest.raises(ValueError, match="line 2 is not JSON"):
    data.prepare(bad, tmp_path / "out")


def test_grouped_sharding_of_text_without_sources_is_refused(tmp_path):
  with pytest.raises(ValueError, match="sources"):
    data.text_bytes(seq_len=16, sharding="source")


def test_per_worker_data_gives_each_worker_exactly_its_own_examples():
  rng = np.random.default_rng(0)
  parts = [data.arrays(rng.normal(size=(30 + 10 * k, 3)) + 100 * k,
                       np.full(30 + 10 * k, k % 2)) for k in range(3)]
  joined = data.per_worker(parts)
  sampler = joined.build(num_workers=3, batch_size=4, seed=0)
  x = np.asarray(sampler.arrays["x"])
  idx, lengths = np.asarray(sampler.shard_idx_W), np.asarray(
      sampler.shard_len_W)
  for w, part in enumerate(parts):
    mine = x[idx[w, :lengths[w]]]
    np.testing.assert_array_equal(np.sort(mine, axis=0),
                                  np.sort(part.train["x"], axis=0))
  with pytest.raises(ValueError, match="3 workers their own"):
    joined.build(num_workers=2, batch_size=4, seed=0)


def test_per_worker_text_windows_never_cross_between_workers(corpus, tmp_path):
  _, out, _ = corpus
  first = data.prepared(out, seq_len=8)
  second = data.prepared(out, seq_len=8)
  joined = data.per_worker([first, second])
  tokens = joined.train["tokens"]
  sampler = joined.build(num_workers=2, batch_size=2, seed=0)
  idx, lengths = np.asarray(sampler.shard_idx_W), np.asarray(
      sampler.shard_len_W)
  own = np.asarray(first.train["tokens"])
  n = first.num_examples()
  assert list(lengths) == [n, n]
  for w in range(2):  # worker w's windows are its source's, in order
    for j, i in enumerate(sorted(idx[w, :lengths[w]])):
      np.testing.assert_array_equal(tokens[i * 8:i * 8 + 9],
                                    own[j * 8:j * 8 + 9])
  with pytest.raises(ValueError, match="is classification data"):
    data.per_worker([first, data.digits()])
  again = data.get(**joined.config)  # prepared sources rebuild by path
  np.testing.assert_array_equal(again.train["tokens"], tokens)


def test_a_small_corpus_always_holds_one_document_out(tmp_path):
  path = tmp_path / "three.txt"
  path.write_text("line one\nline two\nline three\n")
  meta = data.prepare(path, tmp_path / "out", split_on="line",
                      val_fraction=0.001, vocab_size=260)
  assert meta["val"]["documents"] == 1 and meta["train"]["documents"] == 2


def test_held_out_documents_are_the_seeded_draw_once_the_corpus_is_large(
    tmp_path):
  texts = [f"Document {i}: " + "plenty of words here " * 20 for i in range(200)]
  path = tmp_path / "big.txt"
  path.write_text("\n\n".join(texts))
  data.prepare(path, tmp_path / "out", vocab_size=300, val_fraction=0.1,
               seed=7)
  rng = np.random.default_rng(7)  # the rule, written out: one draw each
  expected = [t for t in texts if rng.random() < 0.1]
  assert _doc_texts(tmp_path / "out", "val") == expected


def test_a_small_corpus_keeps_enough_validation_text(tmp_path):
  texts = [f"Short note {i} about the weather." for i in range(400)]
  path = tmp_path / "notes.txt"
  path.write_text("\n".join(texts))  # one paragraph: lines are documents
  meta = data.prepare(path, tmp_path / "out", vocab_size=300,
                      val_fraction=0.01)
  val = _doc_texts(tmp_path / "out", "val")
  assert meta["train"]["documents"] + len(val) == 400
  # 1% of 13 KB would be 130 bytes; it holds out up to half (8 KiB cap).
  total = sum(len(t) for t in texts)
  assert total / 2 - 40 <= sum(len(t) for t in val) <= total / 2
  data.prepared(tmp_path / "out", seq_len=128)  # windows to score
