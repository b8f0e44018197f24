"""Layer rules of DESIGN.md §4, enforced on the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ragpipe"
HEAVY = {"torch", "onnxruntime", "tantivy", "lancedb", "litellm", "sentence_transformers", "transformers", "duckdb", "pyarrow", "numpy", "dagster"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_only_defs_imports_dagster():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in modules()
        if "dagster" in imported_roots(p) and p.relative_to(PACKAGE).parts[0] != "defs"
    ]
    assert offenders == []


def test_kernel_imports_no_heavy_library():
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(imported_roots(p) & HEAVY) for p in (PACKAGE / "kernel").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_provider_sdks_only_in_their_adapters():
    adapters = {
        "sentence_transformers": {"embedding/embedder.py", "retrieval/rerank.py"},
        "litellm": {"answer/litellm_generator.py"},
        "tantivy": {"index/lexical.py", "index/lexical_checks.py"},
        "lancedb": {"index/vector.py", "index/vector_checks.py"},
        "onnxruntime": {"embedding/onnx_query.py"},
    }
    for sdk, allowed in adapters.items():
        users = {str(p.relative_to(PACKAGE)) for p in modules() if sdk in imported_roots(p)}
        assert users <= allowed, f"{sdk} imported outside its adapter: {sorted(users - allowed)}"


def test_boundary_scanner_sees_imports(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("import dagster\nfrom lancedb import connect\nfrom . import sibling\n")
    assert imported_roots(probe) == {"dagster", "lancedb"}


def test_lower_layers_never_import_higher_ones():
    """An index adapter serves retrieval; it never reaches up into it (nor into answers or Dagster).
    The retriever answers over any bundle it is given; it never reads the release store, the stage
    workspace, evaluations or experiments (``ragpipe.api`` joins retrieval and releases). Releases
    never reach up into the Dagster layer or the CLI. Lazy imports inside functions count too."""
    top = ("ragpipe.defs", "ragpipe.cli", "ragpipe.api")
    higher = {
        "index": ("ragpipe.retrieval", "ragpipe.answer", "ragpipe.stages", *top),
        "retrieval": ("ragpipe.release", "ragpipe.stages", "ragpipe.evaluation", "ragpipe.experiment", *top),
        "release": top,
        "evaluation": ("ragpipe.experiment", "ragpipe.release", *top),
    }
    offenders = []
    for layer, banned in higher.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(banned):
                    offenders.append(f"{path.relative_to(PACKAGE)}: {node.module}")
    assert offenders == []
