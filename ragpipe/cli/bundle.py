"""``ragpipe bundle verify|inspect``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ragpipe.cli.common import JsonOpt, emit_json, fail, out

bundle_app = typer.Typer(help="Verify and inspect index bundles.", no_args_is_help=True)


@bundle_app.command("verify")
def bundle_verify(path: Annotated[Path, typer.Argument(help="Bundle directory.")]) -> None:
    """Verify every file, digest, count and chunk of a bundle; non-zero exit if anything is wrong."""
    from ragpipe.bundle.verify import BundleVerificationError, open_bundle  # pyarrow: only when it runs

    try:
        bundle = open_bundle(path)
    except BundleVerificationError as exc:
        fail(str(exc))
    m = bundle.manifest
    out.print(
        f"ok: {m.bundle_id} material {m.material_digest} ({len(m.files)} files verified, {m.seal.kind} seal)",
        soft_wrap=True,
        highlight=False,
    )


@bundle_app.command("inspect")
def bundle_inspect(
    path: Annotated[Path, typer.Argument(help="Bundle directory.")],
    as_json: JsonOpt = False,
) -> None:
    """Show a verified bundle's manifest: ID, counts, specs and files, and what serves its
    vectors, and how."""
    from ragpipe.bundle.verify import BundleVerificationError, open_bundle  # pyarrow: only when it runs
    from ragpipe.retrieval.vector_engine import bundle_vector_engine

    try:
        bundle = open_bundle(path)
        engine = bundle_vector_engine(bundle)
    except (BundleVerificationError, ValueError) as exc:  # ValueError: vectors the manifest does not bind
        fail(str(exc))
    m = bundle.manifest
    if as_json:
        emit_json(
            {
                "bundle_id": m.bundle_id,
                "material_digest": m.material_digest,
                "seal": m.seal.model_dump(),
                "embeddings_digest": m.material.embeddings_digest,
                "path": str(bundle.path),
                "counts": m.semantic.counts.model_dump(),
                "corpus_digest": m.semantic.corpus_digest,
                "default_scope": m.semantic.default_scope,
                "specs": {k: v.model_dump() for k, v in m.semantic.specs.items()},
                "files": [f.model_dump() for f in m.files],
                "bytes": sum(f.size for f in m.files),
                "vector_engine": engine.as_dict() if engine else None,
            }
        )
        return
    seal = f"{m.seal.kind}" + (f" (key {m.seal.key_id})" if m.seal.key_id else "")
    out.print(
        f"[bold]bundle[/]   {m.bundle_id}\nmaterial {m.material_digest}\nseal     {seal}\n"
        f"path     {bundle.path}\ncorpus   {m.semantic.corpus_digest}\n"
        f"vectors  {escape(engine.why) if engine else 'none (lexical only)'}",
        soft_wrap=True,
    )
    counts = Table(title="counts")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for k, v in m.semantic.counts.model_dump().items():
        counts.add_row(k, str(v))
    out.print(counts)
    specs = Table(title="specs")
    specs.add_column("stage")
    specs.add_column("spec ID")
    specs.add_column("spec", overflow="fold")
    for k, v in m.semantic.specs.items():
        specs.add_row(k, v.spec_id, json.dumps(v.spec, sort_keys=True))
    out.print(specs)
    out.print(f"{len(m.files)} files, {sum(f.size for f in m.files):,} bytes")
