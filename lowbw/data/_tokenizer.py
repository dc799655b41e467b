"""Byte-level BPE tokenizers (the ``tokenizers`` library) and the byte
"tokenizer" of the built-in text data.

A byte-level BPE starts from the 256 byte values, so it encodes any text
and decodes its ids back to exactly that text. Documents are separated by
one end-of-text token, ``<|endoftext|>`` (GPT-2's), which the trainer adds
to the vocabulary.
"""

import os
from collections.abc import Iterable
from typing import Any

from lowbw import _validate

EOS = "<|endoftext|>"
# Token ids are stored as uint16 on disk and on device.
MAX_VOCAB = 2 ** 16
MIN_VOCAB = 257  # the 256 bytes and the end-of-text token
# Longest piece (in bytes) the BPE trainer sees. The byte-level split cuts
# text at spaces and punctuation; a run without them (one long line of
# letters, base64) stays one piece, and training on a piece costs time
# that grows with its length at every merge: 300,000 letters took minutes.
# Longer runs are cut into pieces of this length (an ordinary word is
# never this long, so its tokens are unchanged).
MAX_PIECE = 256
# Other end-of-text spellings an existing tokenizer may use.
_EOS_SPELLINGS = (EOS, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


def train_bpe(texts: Iterable[str], vocab_size: int, progress: bool = False,
              length: int | None = None):
  """A byte-level BPE with ``vocab_size`` ids (the 256 byte values, the
  end-of-text token and the learned merges), trained on ``texts``."""
  from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers,
                          trainers)
  vocab_size = check_vocab_size(vocab_size)
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.ByteLevel(add_prefix_space=False),
      # After the byte-level mapping every byte is one visible character
      # (no newline), so "." matches each one.
      pre_tokenizers.Split(Regex(f".{{1,{MAX_PIECE}}}"), behavior="isolated")])
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[EOS], show_progress=progress,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(texts, trainer, length=length)
  return tokenizer


def check_vocab_size(vocab_size) -> int:
  vocab_size = _validate.positive_int("vocab_size", vocab_size)
  if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
    raise _validate.fail(
        "vocab_size", vocab_size,
        f"expected {MIN_VOCAB} (the 256 bytes and {EOS}) to {MAX_VOCAB} "
        "(ids are stored as uint16)")
  return vocab_size


def load(path):
  """A tokenizer from a ``tokenizer.json`` file (the ``tokenizers``
  library's format, as Hugging Face models ship it)."""
  from tokenizers import Tokenizer
  path = _validate.existing_file("tokenizer", path, "a tokenizer.json file")
  try:
    tokenizer = Tokenizer.from_file(path)
  except Exception as e:  # the library raises its own Exception subclass
    raise _validate.fail("tokenizer", path, "expected a tokenizer.json "
                         f"of the tokenizers library ({e})") from None
  size = tokenizer.get_vocab_size()
  if size > MAX_VOCAB:
    raise _validate.fail("tokenizer", path, f"its vocabulary has {size} "
                         f"ids; at most {MAX_VOCAB} are supported (uint16)")
  return tokenizer


def eos_id(tokenizer) -> int | None:
  """The id of the tokenizer's end-of-text token, None without one."""
  for spelling in _EOS_SPELLINGS:
    token = tokenizer.token_to_id(spelling)
    if token is not None:
      return token
  return None


class Bytes:
  """The built-in text data's tokenizer: a token is a UTF-8 byte (ids
  0-255); decoding replaces invalid byte sequences."""

  def encode_ids(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode_ids(self, ids) -> str:
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode(
        "utf-8", errors="replace")

  def vocab_size(self) -> int:
    return 256

  def eos_id(self) -> None:
    return None  # bytes have no end-of-text token


class BPE:
  """A ``tokenizers`` tokenizer with the same two methods as ``Bytes``."""

  def __init__(self, tokenizer: Any):
    self.tokenizer = tokenizer

  def encode_ids(self, text: str) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def decode_ids(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids],
                                 skip_special_tokens=False)

  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size()

  def eos_id(self) -> int | None:
    return eos_id(self.tokenizer)
