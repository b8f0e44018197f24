"""The layer order of docs/architecture.md ("Layers"), read from its table and enforced on the
source tree.

Every package (or top-level module) of ``ragpipe`` sits on exactly one floor and imports only
from floors below it; imports inside a package are free, but no module import graph has a cycle.
Lazy imports inside functions count like any other. Frameworks and provider SDKs stay in their
floors and adapters.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ragpipe"

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def layer_table(text: str) -> list[tuple[str, str]]:
    """The (wing, unit) rows of the "Layers" table of docs/architecture.md, bottom to top: the one
    place the order is written (``kernel/`` → ``kernel``, ``spec.py`` → ``spec``)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1].startswith("`") and cells[1].endswith("`"):
            rows.append((cells[0], cells[1].strip("`").removesuffix("/").removesuffix(".py")))
    return rows


LAYERS = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
# Bottom to top: a unit imports only units listed before it.
FLOORS = tuple(unit for _, unit in LAYERS)
# Bottom to top; each wing is a run of consecutive floors.
WINGS = tuple(dict.fromkeys(wing for wing, _ in LAYERS))
HEAVY = {
    "torch",
    "onnxruntime",
    "tantivy",
    "lancedb",
    "litellm",
    "sentence_transformers",
    "transformers",
    "duckdb",
    "pyarrow",
    "numpy",
    "dagster",
}


def unit_of(path: Path, package: Path = PACKAGE) -> str:
    """The floor unit of a module: its package under ``ragpipe/``, or a top-level module's name
    (``__init__`` for the package's own ``__init__.py``, which every import of ragpipe runs)."""
    first = path.relative_to(package).parts[0]
    return first[:-3] if first.endswith(".py") else first


def ragpipe_imports(path: Path, package: Path = PACKAGE) -> list[str]:
    """Every ``ragpipe.*`` module ``path`` imports, absolute or relative, at any depth."""
    # The package relative imports start from (``__package__``): a module's parent package, or the
    # package itself for its ``__init__.py`` — dropping the last part gives both.
    parts = path.relative_to(package).with_suffix("").parts
    package_parts = ["ragpipe", *parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("ragpipe.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "ragpipe":
                found += [f"ragpipe.{a.name}" for a in node.names]
            elif name.startswith("ragpipe."):
                found.append(name)
    return found


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_unit_sits_on_one_floor():
    units = {unit_of(p) for p in modules()} - {"__init__"}
    assert units - set(FLOORS) == set(), (
        "a package or top-level module with no floor: add it to FLOORS and docs/architecture.md"
    )
    assert set(FLOORS) - units == set(), "a floor without code: remove it from FLOORS and docs/architecture.md"


def test_the_layer_table_is_well_formed():
    """Every floor once, and the seven wings each a run of consecutive floors, named in the order
    the page's prose gives them."""
    assert len(FLOORS) == len(set(FLOORS))
    runs = [wing for i, (wing, _) in enumerate(LAYERS) if i == 0 or LAYERS[i - 1][0] != wing]
    assert runs == list(WINGS), "a wing's floors are not consecutive in docs/architecture.md"
    assert WINGS == ("foundation", "build", "query", "judge", "serve", "run", "face")
    prose = ARCHITECTURE.read_text(encoding="utf-8").split("seven **wings**", 1)[1].split("\n\n", 1)[0]
    assert tuple(re.findall(r"\*([a-z]+)\*", prose)) == WINGS


def test_layer_table_parsing():
    text = "x\n## Layers\n\n| wing | floor | role |\n|---|---|---|\n| a | `k/` | r |\n| b | `s.py` | r |\n\n## Next\n| c | `z/` | r |\n"
    assert layer_table(text) == [("a", "k"), ("b", "s")]


def test_imports_only_run_downward():
    floor = {"__init__": -1, **{name: i for i, name in enumerate(FLOORS)}}  # every import runs __init__ first
    upward = []
    for path in modules():
        own = unit_of(path)
        for name in ragpipe_imports(path):
            target = name.split(".")[1]
            if target != own and target in floor and floor[target] >= floor[own]:
                upward.append(f"{path.relative_to(PACKAGE)} ({own}) imports {name} ({target})")
    assert upward == []


def test_no_module_import_cycle():
    names = {
        ".".join(("ragpipe", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    edges = {m: {t for t in ragpipe_imports(p) if t in names and t != m} for m, p in names.items()}
    # from pkg import submodule: the submodule is imported too
    for m, p in names.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and node.module.startswith("ragpipe")
            ):
                edges[m] |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in names}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(trail[trail.index(t) :] + [t]) if t in trail else f"{m} -> {t}")
            elif t not in state:
                visit(t, trail + [t])
        state[m] = 2

    for m in sorted(names):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_only_defs_and_orchestration_import_dagster():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in modules()
        if any(r == "dagster" or r.startswith("dagster_") for r in imported_roots(p))
        and unit_of(p) not in {"defs", "orchestration"}
    ]
    assert offenders == []


def private_dagster_imports(path: Path) -> list[str]:
    """Imports of Dagster internals: ``dagster._*`` in any import form, and ``dagster_shared``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(("dagster._", "dagster_shared"))]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith(("dagster._", "dagster_shared")):
                found.append(node.module)
            elif node.module == "dagster":
                found += [f"dagster.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_private_dagster_apis_only_in_dagster_internals():
    users = {str(p.relative_to(PACKAGE)) for p in modules() if private_dagster_imports(p)}
    assert users <= {"orchestration/dagster_internals.py"}


def test_kernel_imports_no_heavy_library():
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(imported_roots(p) & HEAVY) for p in (PACKAGE / "kernel").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_provider_sdks_only_in_their_adapters():
    adapters = {
        "sentence_transformers": {"embedding/embedder.py", "retrieval/rerank.py"},
        "litellm": {"work/chat.py"},
        "boto3": {"storage/s3.py"},
        "botocore": {"storage/s3.py"},
        "tantivy": {"index/lexical.py", "index/lexical_checks.py"},
        "lancedb": {"index/vector.py", "index/vector_checks.py"},
        "onnxruntime": {"embedding/onnx_query.py"},
        "fastapi": {"server/app.py", "server/errors.py"},
        "uvicorn": {"cli/serve.py", "server/connections.py"},
        "prometheus_client": {"server/metrics.py"},
        "jinja2": {"server/lab/views.py"},
        "playwright": set(),  # the lab's browser tests only
    }
    for sdk, allowed in adapters.items():
        users = {str(p.relative_to(PACKAGE)) for p in modules() if sdk in imported_roots(p)}
        assert users <= allowed, f"{sdk} imported outside its adapter: {sorted(users - allowed)}"


def test_the_package_never_imports_tests_or_benchmarks():
    offenders = [str(p.relative_to(PACKAGE)) for p in modules() if imported_roots(p) & {"ragpipe_tests", "benchmarks"}]
    assert offenders == []


def test_boundary_scanner_sees_imports(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("import dagster\nfrom lancedb import connect\nfrom . import sibling\n")
    assert imported_roots(probe) == {"dagster", "lancedb"}
    package = tmp_path / "ragpipe"
    (package / "retrieval").mkdir(parents=True)
    module = package / "retrieval" / "retriever.py"
    module.write_text(
        "from ragpipe.answer.answering import answer\nfrom ..release import store\nfrom . import plan\n\n\ndef f():\n    import ragpipe.cli.app\n"
    )
    (package / "retrieval" / "__init__.py").write_text("from ..cli import app\nfrom .plan import QueryPlan\n")
    assert ragpipe_imports(package / "retrieval" / "__init__.py", package) == ["ragpipe.cli", "ragpipe.retrieval.plan"]
    private = tmp_path / "private.py"
    private.write_text(
        "import dagster._core.x\nfrom dagster import _check, asset\nfrom dagster_shared.error import E\n"
    )
    assert private_dagster_imports(private) == ["dagster._core.x", "dagster._check", "dagster_shared.error"]
    assert unit_of(module, package) == "retrieval"
    assert ragpipe_imports(module, package) == [
        "ragpipe.answer.answering",
        "ragpipe.release",
        "ragpipe.retrieval",
        "ragpipe.cli.app",
    ]
