"""``ragpipe embedder pin``: the digest that pins a sentence-transformers model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ragpipe.cli.common import JsonOpt, emit_json, fail, out

embedder_app = typer.Typer(help="Pin embedder model folders.", no_args_is_help=True)


@embedder_app.command("pin")
def embedder_pin(
    path: Annotated[Path, typer.Argument(help="The model folder.")],
    write: Annotated[
        bool,
        typer.Option(
            "--write/--no-write",
            help="Record the file list in the folder (ragpipe-files.json), so a folder that later differs is "
            "refused naming the file.",
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Print the folder's files_sha256 (the digest over every file the model loads from) and the
    embedder spec lines that pin it (docs/embedders.md)."""
    from ragpipe.embedding.model_folder import MANIFEST, ModelFolderError, pin

    try:
        digest, files, written = pin(path, write_manifest=write)
    except ModelFolderError as exc:
        fail(str(exc))
    if as_json:
        emit_json(
            {
                "files_sha256": digest,
                "files": [f.as_json() for f in files],
                "manifest": str(written) if written else None,
            }
        )
        return
    for f in files:
        out.print(f"{f.sha256}  {f.bytes:>12}  {f.path}", highlight=False, markup=False, soft_wrap=True)
    out.print(f"files_sha256: {digest}  ({len(files)} files)", highlight=False, markup=False, soft_wrap=True)
    if written is not None:
        out.print(f"recorded the file list in {written}", highlight=False, markup=False, soft_wrap=True)
    elif write:
        out.print(f"could not write {path / MANIFEST}: a folder that differs is refused without naming the file",
                  highlight=False, markup=False, soft_wrap=True)  # fmt: skip
    out.print(f"embedder:\n  model_name: {path.resolve().name}\n  model_path: {path.resolve()}\n  files_sha256: {digest}",
              highlight=False, markup=False, soft_wrap=True)  # fmt: skip
