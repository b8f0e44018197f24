"""``ragpipe embedder pin``: the digest that pins a sentence-transformers model folder;
``ragpipe embedder pin-graph``: the digest that pins an int8 graph of the pipeline spec's model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ragpipe.cli.common import JsonOpt, emit_json, fail, out

embedder_app = typer.Typer(help="Pin embedder model folders and int8 graphs.", no_args_is_help=True)


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


@embedder_app.command("pin-graph")
def embedder_pin_graph(
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The pipeline spec file whose embedder's model is quantised (default: $RAGPIPE_PIPELINE_SPEC, "
            "else the checked-in spec).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make this host's int8 graph of the pipeline spec's model (seconds: torch exports it,
    onnxruntime fuses and quantises it), keep it in $RAGPIPE_HOME/query_graphs/, and print its
    graph_sha256 with the embedder lines (and the candidate --set edits) that pin it
    (docs/embedders.md). The spec file's own runtime, quantization and graph_sha256 are ignored."""
    from ragpipe.embedding.embedder import EmbedderError
    from ragpipe.embedding.query_graph import pin_graph
    from ragpipe.kernel.workspace import Workspace, default_home
    from ragpipe.spec import PipelineSpecError, load_model_embedder, own_spec_id

    try:
        model = load_model_embedder(spec_file)
        pinned, encoder = pin_graph(Workspace(default_home()).query_graphs, model)
    except (PipelineSpecError, EmbedderError) as exc:
        fail(str(exc))
    lines = ("runtime: onnxruntime", "quantization: int8", f"graph_sha256: {pinned.graph_sha256}")
    edits = " ".join(f"--set embeddings.{line.replace(': ', '=')}" for line in lines)
    if as_json:
        emit_json(
            {
                "graph_sha256": pinned.graph_sha256,
                "embedder_spec_id": own_spec_id("embeddings", pinned),
                "entry": str(encoder.entry),
                "min_cosine_to_torch": encoder.min_cosine_to_torch,
                "set": edits.split(" "),
            }
        )
        return
    text = (
        f"graph_sha256: {pinned.graph_sha256}  (the int8 graph of {pinned.label} made here; probes at cosine "
        f">= {encoder.min_cosine_to_torch:.4f} to torch; entry {encoder.entry})\n"
        "embedder:\n" + "".join(f"  {line}\n" for line in lines) + f"a candidate: {edits}"
    )
    out.print(text, highlight=False, markup=False, soft_wrap=True)
