"""The BEIR SciFact folder the benchmarks read, named on the command line.

The folder (``corpus.jsonl.gz``, ``queries.jsonl``, ``qrels/train.tsv`` and ``qrels/test.tsv``)
lives outside the repository, so no script assumes where it is: ``--scifact PATH`` has no default
(docs/benchmarks.md, "Data").
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "the BEIR SciFact folder: corpus.jsonl.gz, queries.jsonl, qrels/{train,test}.tsv"


def scifact_folder(value: str) -> Path:
    """``value`` as a path, if it is a folder holding ``corpus.jsonl.gz`` and ``queries.jsonl``;
    otherwise argparse reports one line naming the flag, the path and the missing file."""
    path = Path(value)
    for name in ("corpus.jsonl.gz", "queries.jsonl"):
        if not (path / name).is_file():
            raise argparse.ArgumentTypeError(f"{path}: no {name} (not a BEIR SciFact folder)")
    return path


def add_scifact_argument(parser: argparse.ArgumentParser, *, fallback: str | None = None) -> None:
    """Add ``--scifact PATH`` to ``parser``: required (argparse exits with "the following
    arguments are required: --scifact" when it is missing), or, with ``fallback``, optional and
    ``None`` when missing, ``fallback`` saying in the help what the script reads instead."""
    if fallback is None:
        parser.add_argument("--scifact", type=scifact_folder, required=True, metavar="PATH", help=HELP)
    else:
        help_text = f"{HELP} (default: {fallback})"
        parser.add_argument("--scifact", type=scifact_folder, default=None, metavar="PATH", help=help_text)
