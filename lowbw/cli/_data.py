"""``lowbw data prepare``: a local corpus into a folder of token files that
``lowbw train --data DIR`` trains on."""

import argparse

from lowbw import data as data_lib
from lowbw.telemetry import _progress


def _recipes_help() -> str:
  return "; ".join(f"{r.name}: {r.about}" for r in data_lib.RECIPES.values())


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "data", help="prepare a local corpus for training (tokenizer, token "
      "files)", description="Work with datasets on this machine. Nothing is "
      "downloaded: every source is a local path.")
  sub = p.add_subparsers(title="data commands", metavar="ACTION",
                         dest="action", required=True)
  q = sub.add_parser(
      "prepare", help="tokenize a local corpus into a folder for --data",
      description="Read a text file, a folder of text files, JSONL/Parquet "
      "files with a text field, or a Hugging Face dataset saved with "
      "save_to_disk; train a byte-level BPE tokenizer on it (or use a "
      "given tokenizer.json); hold out whole documents for validation; "
      "write OUT/{train,val}.bin (uint16 tokens), document offsets, "
      "sources, tokenizer.json and meta.json. Then: lowbw train --data OUT.")
  q.add_argument("source", metavar="SOURCE", help="a file or folder")
  q.add_argument("--out", required=True, metavar="DIR",
                 help="the folder to write")
  q.add_argument("--recipe", choices=sorted(data_lib.RECIPES),
                 help="a known corpus's layout and usual settings: "
                 + _recipes_help())
  q.add_argument("--vocab-size", type=int, metavar="N", help="ids of the "
                 "BPE tokenizer trained on the corpus, 257 to 65536 "
                 "(default 4096, or the recipe's)")
  q.add_argument("--tokenizer", metavar="FILE", help="an existing "
                 "tokenizer.json to use instead of training one")
  q.add_argument("--val-fraction", type=float, metavar="F", help="share of "
                 "documents held out for validation (default 0.05, or the "
                 "recipe's)")
  q.add_argument("--seed", type=int, help="seeds which documents are held "
                 "out (default 0)")
  q.add_argument("--text-column", metavar="NAME", help="the text field of "
                 "JSONL/Parquet/Arrow records (default text)")
  q.add_argument("--source-column", metavar="NAME", help="a record field "
                 "naming each document's source, for --sharding source or "
                 "dirichlet (default: the file it came from)")
  q.add_argument("--split-on", choices=("file", "paragraph", "line"),
                 help="how plain text files are cut into documents (default: "
                 "paragraph for one file, file for a folder)")
  q.add_argument("--delimiter", metavar="TEXT", help="a string that "
                 "separates documents in text files (e.g. <|endoftext|>)")
  q.add_argument("--include", action="append", metavar="GLOB",
                 help="of a folder, read only the files whose name or path "
                 "inside it matches GLOB (e.g. '*.md'; repeat for more "
                 "patterns). A .json file is one JSON document (a list of "
                 "records or one record); a .jsonl file holds a record per "
                 "line")
  q.add_argument("--overwrite", action="store_true",
                 help="replace a corpus already prepared in DIR")
  q.add_argument("--progress", action=argparse.BooleanOptionalAction,
                 help="progress bars (default: on a terminal)")
  q.set_defaults(run=run_prepare)


def run_prepare(args) -> int:
  progress = (_progress.is_terminal() if args.progress is None
              else args.progress)
  meta = data_lib.prepare(
      args.source, args.out, progress=progress, overwrite=args.overwrite,
      recipe_name=args.recipe, vocab_size=args.vocab_size,
      tokenizer=args.tokenizer, val_fraction=args.val_fraction,
      seed=args.seed, text_column=args.text_column,
      source_column=args.source_column, split_on=args.split_on,
      delimiter=args.delimiter,
      include=None if args.include is None else tuple(args.include))
  train, val = meta["train"], meta["val"]
  print(f"prepared {args.out}: vocabulary {meta['vocab_size']:,}; train "
        f"{train['tokens']:,} tokens in {train['documents']:,} documents, "
        f"val {val['tokens']:,} tokens in {val['documents']:,} documents, "
        f"{len(meta['sources']):,} sources")
  print(f"train on it: lowbw train --data {args.out}")
  return 0
