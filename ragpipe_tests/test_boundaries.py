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


SETTINGS_MODULE = "kernel/settings.py"  # the one reader of RAGPIPE_* variables (docs/configuration.md)
_ENVIRON = {"environ", "environb"}
_ENV_CALLS = {"getenv", "getenvb"}


def _literals(tree: ast.Module) -> dict[str, object]:
    """``NAME = <str or bytes literal>`` at the top level of a module."""
    found: dict[str, object] = {}
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, bytes)):
            found.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return found


def _constants(tree: ast.Module, package: Path) -> dict[str, list[object]]:
    """What a name may stand for: the module's own literals, those it imports from another
    ragpipe module (``from ragpipe.x import NAME``), and a loop variable over a tuple or list of
    those (``for name in (A, B)``, in a statement or a comprehension)."""
    found: dict[str, list[object]] = {name: [value] for name, value in _literals(tree).items()}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
            parts = node.module.split(".")[1:]
            source = package.joinpath(*parts).with_suffix(".py")
            if source.is_file():
                theirs = _literals(ast.parse(source.read_text(encoding="utf-8")))
                found.update({a.asname or a.name: [theirs[a.name]] for a in node.names if a.name in theirs})
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            if isinstance(node.iter, (ast.Tuple, ast.List)):
                values = [v for element in node.iter.elts for v in _key(element, found)]
                found[node.target.id] = list(dict.fromkeys([*found.get(node.target.id, []), *values]))
    return found


def _key(node: ast.AST | None, constants: dict[str, list[object]]) -> list[object]:
    """The literals a key expression may stand for: a literal, a constant (``_constants``), or
    either wrapped in ``os.fsencode(...)`` / ``.encode()``; none when it is not that simple."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "encode":
            return _key(func.value, constants)
        if (isinstance(func, ast.Attribute) and func.attr == "fsencode") or (
            isinstance(func, ast.Name) and func.id == "fsencode"
        ):
            return _key(node.args[0] if node.args else None, constants)
    return []


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in _ENVIRON) or (
        isinstance(node, ast.Name) and node.id in _ENVIRON
    )


def ragpipe_environ_reads(path: Path, package: Path = PACKAGE) -> list[str]:
    """``line: NAME`` for each access to the process environment with a ``RAGPIPE_*`` name:
    ``os.environ[...]``, ``os.environ.get/setdefault/pop(...)``, ``... in os.environ``,
    ``os.getenv(...)``, the same on ``environb`` or a bare ``environ`` (``from os import environ``),
    the name a literal or a constant (``_constants``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = _constants(tree, package)
    keys: list[tuple[int, ast.AST | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            keys.append((node.lineno, node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_environ(node.func.value):
            keys.append((node.lineno, node.args[0] if node.args else None))
        elif isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Attribute) and node.func.attr in _ENV_CALLS)
            or (isinstance(node.func, ast.Name) and node.func.id in _ENV_CALLS)
        ):
            keys.append((node.lineno, node.args[0] if node.args else None))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            keys.append((node.lineno, node.left))
    found = []
    for line, key in sorted(keys, key=lambda k: k[0]):
        for value in _key(key, constants):
            name = value.decode(errors="replace") if isinstance(value, bytes) else value
            if isinstance(name, str) and name.startswith("RAGPIPE_"):
                found.append(f"{line}: {name}")
    return list(dict.fromkeys(found))


def test_only_the_settings_module_reads_ragpipe_variables():
    readers = {str(p.relative_to(PACKAGE)): ragpipe_environ_reads(p) for p in modules()}
    assert {path: reads for path, reads in readers.items() if reads and path != SETTINGS_MODULE} == {}


def test_the_environ_scanner_sees_every_form(tmp_path: Path):
    package = tmp_path / "ragpipe"
    package.mkdir()
    (package / "names.py").write_text("EXECUTOR_ENV = 'RAGPIPE_X'\n")
    probe = package / "probe.py"
    probe.write_text(
        "import os\nfrom os import environ, getenv\nfrom ragpipe.names import EXECUTOR_ENV as EXE\n"
        "ENV = 'RAGPIPE_A'\nKEY: str = 'RAGPIPE_B'\n"
        "os.environ.get('RAGPIPE_C')\nos.environ[ENV]\nos.getenv(KEY, '')\nenviron.setdefault('RAGPIPE_D', '')\n"
        "os.environb[os.fsencode(ENV)]\n'RAGPIPE_E' in os.environ\ngetenv(b'RAGPIPE_F'.decode())\n"
        "os.environ.get('HF_HUB_OFFLINE')\nchild = {**os.environ, 'RAGPIPE_G': 'x'}\nos.environ.get(KEY.lower())\n"
        "os.environ.get(EXE)\n{n: os.environb[os.fsencode(n)] for n in (ENV, KEY)}\n"
    )
    assert ragpipe_environ_reads(probe, package) == [
        "6: RAGPIPE_C",
        "7: RAGPIPE_A",
        "8: RAGPIPE_B",
        "9: RAGPIPE_D",
        "10: RAGPIPE_A",
        "11: RAGPIPE_E",
        "16: RAGPIPE_X",
        "17: RAGPIPE_A",
        "17: RAGPIPE_B",
    ]


WORKSPACE_MODULE = "kernel/workspace.py"
# an expression that is a home itself: home, ws.home, self.home, default_home(…), _home(), Path(home)
HOME_EXPRESSION = re.compile(r"(^|\.)(home|_home\(\)|default_home\(.*\))$|^Path\(([\w.]*\.)?home\)$")


def home_folder_joins(path: Path) -> list[str]:
    """``<home> / "<name>"`` joins in ``path``: a ``/`` whose left side names a home (``home``,
    ``ws.home``, ``default_home()``, ``Path(home)`` …) and whose right side is a string literal —
    a folder of ``$RAGPIPE_HOME`` named outside ``Workspace``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and isinstance(node.right.value, str)
            and HOME_EXPRESSION.search(ast.unparse(node.left))
        ):
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_the_homes_layout_is_named_only_by_workspace():
    """Every folder of ``$RAGPIPE_HOME`` is a property of ``Workspace`` (kernel/workspace.py)."""
    joins = {str(p.relative_to(PACKAGE)): home_folder_joins(p) for p in modules()}
    assert {path: found for path, found in joins.items() if found and path != WORKSPACE_MODULE} == {}


def test_the_home_join_scanner_sees_every_form(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "a = ws.home / 'evaluations'\nb = default_home() / 'tune' / run\nc = Path(home) / 'datasets'\n"
        "d = folder / 'leases'\ne = ws.evaluations / run_id\nf = self.home / DATASETS\n"
        "g = dataset_dir(home, name) / 'ledger.jsonl'\nh = Workspace(home).generation_cache / 'judge'\n"
    )
    assert home_folder_joins(probe) == [
        "1: ws.home / 'evaluations'",
        "2: default_home() / 'tune'",
        "3: Path(home) / 'datasets'",
    ]


# ---- the tests' own house: fixtures in conftest.py files, helpers in support/, tests beside ------

TESTS = PACKAGE.parent / "ragpipe_tests"
BENCHMARKS = PACKAGE.parent / "benchmarks"
SUPPORT = TESTS / "support"


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in ``path``, lazy ones included: ``import a.b`` gives
    ``a.b``; ``from a import b`` gives ``a.b`` (``b`` may be a module or a name in ``a``); a
    relative import keeps its leading dots (``from .conftest import x`` gives ``.conftest.x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            joint = "" if base.endswith(".") else "."
            found += [(node.lineno, f"{base}{joint}{a.name}") for a in node.names]
    return sorted(found)


def conftest_imports(path: Path) -> list[str]:
    """The imports in ``path`` that reach into a ``conftest`` module (pytest loads conftest.py files
    as plugins; a module importing one gets a second copy of its fixtures and module state)."""
    return [f"{line}: {name}" for line, name in imported_names(path) if "conftest" in name.split(".")]


def imports_of_tests_beyond_support(path: Path) -> list[str]:
    """The imports of ``ragpipe_tests`` in ``path`` other than ``ragpipe_tests.support`` and its modules."""
    return [
        f"{line}: {name}"
        for line, name in imported_names(path)
        if name.split(".")[0] == "ragpipe_tests" and name.split(".")[:2] != ["ragpipe_tests", "support"]
    ]


def non_fixtures(conftest: Path) -> list[str]:
    """The top-level functions and classes of a conftest.py that are neither pytest fixtures nor
    pytest hooks (``pytest_*``): helpers, which belong in ``ragpipe_tests/support/``."""
    found = []
    for node in ast.parse(conftest.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            found.append(f"{node.lineno}: class {node.name}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("pytest_"):
            decorators = [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list]
            if "pytest.fixture" not in decorators:
                found.append(f"{node.lineno}: def {node.name}")
    return found


def test_no_test_or_benchmark_imports_from_a_conftest_module():
    files = sorted([*TESTS.rglob("*.py"), *BENCHMARKS.rglob("*.py")])
    found = {str(p.relative_to(PACKAGE.parent)): conftest_imports(p) for p in files}
    assert {path: names for path, names in found.items() if names} == {}


def test_conftest_files_hold_fixtures_and_hooks_only():
    found = {str(p.relative_to(TESTS)): non_fixtures(p) for p in sorted(TESTS.rglob("conftest.py"))}
    assert "conftest.py" in found
    assert {path: names for path, names in found.items() if names} == {}


def test_support_holds_no_test_files():
    assert sorted(str(p.relative_to(SUPPORT)) for p in SUPPORT.rglob("test_*.py")) == []


def test_benchmarks_import_only_the_support_package_of_the_tests():
    found = {
        str(p.relative_to(BENCHMARKS)): imports_of_tests_beyond_support(p) for p in sorted(BENCHMARKS.rglob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_the_test_house_scanners_see_every_form(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from ragpipe_tests.conftest import REPO\nimport ragpipe_tests.server.conftest\n"
        "from ragpipe_tests import conftest, support\nfrom .conftest import x\nfrom . import conftest as c\n"
        "from ragpipe_tests.support.cli import run_cli\nimport ragpipe_tests.support.paths\n"
        "from ragpipe_tests.release import test_live\nfrom conftests import y\n\n\n"
        "def f():\n    from ragpipe_tests.server.conftest import Serving\n"
    )
    assert conftest_imports(probe) == [
        "1: ragpipe_tests.conftest.REPO",
        "2: ragpipe_tests.server.conftest",
        "3: ragpipe_tests.conftest",
        "4: .conftest.x",
        "5: .conftest",
        "13: ragpipe_tests.server.conftest.Serving",
    ]
    assert imports_of_tests_beyond_support(probe) == [
        "1: ragpipe_tests.conftest.REPO",
        "2: ragpipe_tests.server.conftest",
        "3: ragpipe_tests.conftest",
        "8: ragpipe_tests.release.test_live",
        "13: ragpipe_tests.server.conftest.Serving",
    ]
    conftest = tmp_path / "conftest.py"
    conftest.write_text(
        "import pytest\nSTATE = 1\n\n\n@pytest.fixture\ndef a(): ...\n\n\n"
        '@pytest.fixture(scope="session")\ndef b(): ...\n\n\ndef pytest_configure(config): ...\n\n\n'
        "def helper(): ...\n\n\nclass Serving: ...\n"
    )
    assert non_fixtures(conftest) == ["16: def helper", "19: class Serving"]
