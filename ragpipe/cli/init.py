"""``ragpipe init DIR``: a project for your own corpus, in a new or empty folder.

It writes, derived from the checked-in defaults in ``ragpipe/specs/`` (so they never drift apart):

* ``pipeline.yaml``: the checked-in pipeline spec with its ``evaluation:`` section pointing at
  files of DIR (relative paths resolve against the spec's folder: ``ragpipe.spec``);
* ``query_plan.yaml``: only when the checked-in spec's evaluation section names a query plan
  (it names none: releases then bind ``ragpipe/specs/query_plan.yaml``);
* ``gate_policy.yaml``: a copy of the default gate policy;
* ``targets.yaml``: the default release targets, each accepting DIR's gate policy;
* ``suite.jsonl``: the suite, "empty". The suite parser refuses a file without a case and has no
  comment lines, and the chain loads the suite when the code location loads, so an empty file
  would stop every build before it starts. "Empty" is therefore one placeholder case without a
  judgment: every revision skips it (``no_positive_judgment``), so a build says that no suite
  case applies, and why; replace it with cases of your own;
* ``README.md``: the suite format and the next commands; ``.gitignore``: ``var/``, where the
  printed commands keep this project's state.

Everything is written into a temporary sibling folder, read back with the loaders the pipeline
uses, and renamed into place: DIR is complete or absent, never half written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import uuid
from pathlib import Path
from typing import Annotated

import typer
import yaml

from ragpipe.cli.common import fail

SUITE = "suite.jsonl"
POLICY = "gate_policy.yaml"
PLAN = "query_plan.yaml"
PLACEHOLDER = {
    "id": "placeholder",
    "query": "replace this line with your cases (format: README.md)",
    "target_level": "document",
    "judgments": {},
}
_TOP_KEY = re.compile(r"^[A-Za-z_]")
_ACCEPTS_DEFAULT = re.compile(r"^(\s*gate_policies:\s*)\[default\]", re.MULTILINE)


def _section_span(lines: list[str], key: str) -> tuple[int, int] | None:
    """Lines ``[start, end)`` of the top-level ``key:`` section with the comment block just above it."""
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{key}:\s*(#.*)?$", line)), None)
    if start is None:
        return None
    end = next((j for j in range(start + 1, len(lines)) if _TOP_KEY.match(lines[j])), len(lines))
    if end < len(lines):  # the next section's own comment block stays with it
        while end > start + 1 and (lines[end - 1].startswith("#") or not lines[end - 1].strip()):
            end -= 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return start, end


def _yaml(value: object) -> str:
    """One value in YAML flow style (``[public]``, ``null``, ``{ndcg: 10}``)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n").removesuffix("\n...")


def _entry(key: str, value: object, comment: str = "") -> str:
    line = f"  {key}: {_yaml(value)}"
    return ((line + " ").ljust(27) + f"# {comment}" if comment else line) + "\n"


def pipeline_text(plan: str | None) -> str:
    """The checked-in spec, its ``evaluation:`` section replaced by one naming DIR's files."""
    from ragpipe.spec import DEFAULT_SPEC_PATH, EvaluationSection, load_pipeline_spec

    d = load_pipeline_spec(DEFAULT_SPEC_PATH).evaluation or EvaluationSection(suite=Path(SUITE))
    section = (
        "# The evaluation → gate → release chain after index_bundle (docs/your-corpus.md). Paths are\n"
        "# relative to this file; the content they name (suite digest, plan ID, policy ID) enters the\n"
        "# chain's code versions, never the path.\n"
        "evaluation:\n"
        + _entry("suite", SUITE, "this project's cases (format: README.md)")
        + _entry("split", d.split, "only for a BEIR folder")
        + _entry("mode", d.mode, "hybrid | lexical | vector")
        + _entry("scopes", list(d.scopes), "the subject's scopes (a case's own subject overrides them)")
        + _entry("k", d.k, "retrieval depth")
        + _entry("cutoffs", d.cutoffs, "per metric family, e.g. {ndcg: 10, recall: 100}; null: the defaults")
        + _entry("repeats", d.repeats)
        + _entry("answers", d.answers)
        + _entry("query_plan", plan, "this project's query plan" if plan else "null: ragpipe/specs/query_plan.yaml")
        + _entry("gate_policy", POLICY, "this project's gate policy")
    )
    text = DEFAULT_SPEC_PATH.read_text(encoding="utf-8").replace("# The checked-in pipeline spec. ", "# ", 1)
    lines = text.splitlines(keepends=True)
    span = _section_span(lines, "evaluation")
    head, tail = (lines, []) if span is None else (lines[: span[0]], lines[span[1] :])
    body = "".join(head).rstrip("\n") + "\n\n" + section + ("\n" + "".join(tail).lstrip("\n") if tail else "")
    header = (
        "# This project's pipeline spec (made by `ragpipe init` from ragpipe/specs/pipeline.yaml): used when\n"
        "# RAGPIPE_PIPELINE_SPEC names this file. Only the evaluation section differs from the defaults.\n"
    )
    return header + body


def policy_text() -> str:
    from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH

    return (
        "# This project's gate policy: a copy of ragpipe's default (ragpipe/specs/gate_policy.yaml, docs/gates.md).\n"
        "# A release is eligible only with at least coverage.min_cases evaluated suite cases: lower it while\n"
        "# the suite is smaller (any edit gives a new policy ID, which targets.yaml accepts as it names this file).\n"
        + DEFAULT_POLICY_PATH.read_text(encoding="utf-8")
    )


def targets_text() -> str:
    from ragpipe.release.targets import DEFAULT_TARGETS_PATH

    text = DEFAULT_TARGETS_PATH.read_text(encoding="utf-8")
    changed, n = _ACCEPTS_DEFAULT.subn(rf"\g<1>[{POLICY}]", text)
    if n == 0:  # the defaults are laid out otherwise: keep their content, not their comments
        raw = yaml.safe_load(text)
        for target in raw["targets"].values():
            target["gate_policies"] = [POLICY]
        changed = yaml.safe_dump(raw, sort_keys=False)
    return (
        "# This project's release targets (made by `ragpipe init` from ragpipe/specs/targets.yaml): used when\n"
        f"# RAGPIPE_TARGETS names this file. Every target accepts releases gated under {POLICY}.\n" + changed
    )


def readme_text(folder: Path) -> str:
    env = exports(folder)
    return f"""# A ragpipe project

Made by `ragpipe init`: the pipeline spec, gate policy, release targets and evaluation suite of one
corpus of your own. The full walk-through is `docs/your-corpus.md` in the ragpipe repository.

| file | what |
|---|---|
| `pipeline.yaml` | ragpipe's default pipeline spec; its `evaluation:` section names `{SUITE}` and `{POLICY}` here |
| `{POLICY}` | a copy of the default gate policy (`docs/gates.md`) |
| `targets.yaml` | the release targets `staging` and `production`, both accepting `{POLICY}` |
| `{SUITE}` | the evaluation suite: one placeholder case until you write yours |
| `var/` | made by the first build when you use the variables below: revisions, bundles, releases, the Dagster instance |

## Use it

```bash
{env}
ragpipe build CORPUS --revision KEY [--default-scope SCOPE]  # a Markdown folder or a BEIR JSONL file
ragpipe query --revision KEY "your question"  # the bundle just built, released or not
```

`ragpipe build`, the Dagster UI (`make ui` in the ragpipe checkout) and every other command read the
project from these variables, so export them in each shell you use.

## The suite: `{SUITE}`

One JSON object per line: no blank lines and no comments (the parser refuses both). A case:

```json
{{"id": "water-tomatoes", "query": "how often do I water the tomatoes?", "target_level": "document", "judgments": {{"garden.md": 1}}}}
```

| field | |
|---|---|
| `id` | required; a unique non-empty string |
| `query` | required; the query text |
| `target_level` | required; `document` (judgments name document IDs) or `chunk` (chunk IDs, `sha256:…`) |
| `judgments` | required; `{{target ID: grade}}`, a grade is a whole number ≥ 0; grade ≥ 1 means relevant |
| `tags` | optional; strings, for per-tag slices in reports and gates |
| `answerability` | optional; `answerable` (default) or `unanswerable` (no grade ≥ 1 then) |
| `subject` | optional; `{{"scopes": [...]}}`, the scopes the case is asked under (default: `pipeline.yaml`'s `scopes`) |
| `forbidden_sources` | optional; document IDs the subject must never be shown |

A document ID is the file's path relative to the corpus folder (`garden.md`, `kitchen/bread.md`) for a
Markdown folder, the `_id` for a BEIR file. The complete rules: `docs/evaluation.md`.

**"Empty".** A suite file must hold at least one case, so this one starts with a placeholder case
without a judgment. No revision can evaluate a case without a relevant judgment (it is skipped as
`no_positive_judgment`, never scored), so until you add cases every build says that no suite case
applies, and why. Replace the placeholder line with your cases (a placeholder left beside them is
only counted as skipped).

A case whose judged documents a revision lacks is skipped too (`missing_judged_targets`), so judge
against the document IDs of this corpus: `ragpipe suite validate {shlex.quote(str(folder / SUITE))} --revision KEY`
lists which cases a built revision can evaluate.

## Evaluate and activate

`ragpipe build` evaluates every revision on the suite, gates it under `{POLICY}` and publishes a
release; its summary shows `evaluated_cases`, `skipped_cases`, `eligible`, `decisive_phase` and the
decisive phase's `gate_reasons`. Cases added for a corpus already built: build the same revision
again; it keeps its bundle (every text from the embedding cache) and gets a new evaluation, gate
decision and release. The policy wants `coverage.min_cases` ({_min_cases()}) evaluated cases: lower it
in `{POLICY}` while the suite is smaller. An eligible release is activated with `ragpipe release activate RELEASE_ID`; `ragpipe query
"..."` then serves it without `--revision`.
"""


def _min_cases() -> int:
    from ragpipe.experiment.gate_policy import load_policy

    return load_policy().coverage.min_cases


def exports(folder: Path) -> str:
    """The ``export`` lines that make every command use the project in ``folder``."""
    q = {name: shlex.quote(str(folder / rel)) for name, rel in _VARIABLES}
    return (
        f"export RAGPIPE_PIPELINE_SPEC={q['RAGPIPE_PIPELINE_SPEC']} RAGPIPE_TARGETS={q['RAGPIPE_TARGETS']}\n"
        f"export RAGPIPE_HOME={q['RAGPIPE_HOME']} DAGSTER_HOME={q['DAGSTER_HOME']}"
    )


_VARIABLES = (
    ("RAGPIPE_PIPELINE_SPEC", "pipeline.yaml"),
    ("RAGPIPE_TARGETS", "targets.yaml"),
    ("RAGPIPE_HOME", "var/ragpipe"),
    ("DAGSTER_HOME", "var/dagster"),
)


def project_files(folder: Path) -> dict[str, tuple[str, str]]:
    """``{file name: (text, what it is)}`` of the project to be written at ``folder``."""
    from ragpipe.spec import DEFAULT_SPEC_PATH, load_pipeline_spec

    defaults = load_pipeline_spec(DEFAULT_SPEC_PATH).evaluation
    files: dict[str, tuple[str, str]] = {}
    plan = PLAN if defaults is not None and defaults.query_plan is not None else None
    files["pipeline.yaml"] = (
        pipeline_text(plan),
        f"pipeline spec: ragpipe's defaults, evaluated on {SUITE} under {POLICY}",
    )
    if plan is not None:
        files[PLAN] = (defaults.query_plan.read_text(encoding="utf-8"), "query plan: the one the defaults name")  # type: ignore[union-attr]
    files[POLICY] = (policy_text(), "gate policy: a copy of ragpipe's default")
    files["targets.yaml"] = (targets_text(), f"release targets staging and production, accepting {POLICY}")
    files[SUITE] = (json.dumps(PLACEHOLDER) + "\n", "the suite: one placeholder case without a judgment")
    files["README.md"] = (readme_text(folder), "the suite format and the next steps")
    files[".gitignore"] = ("var/\n", "keeps var/ (this project's state) out of version control")
    return files


def check_project(folder: Path) -> None:
    """Read the project back with the pipeline's own loaders; any problem is a bug of this module."""
    from ragpipe.evaluation.suite_load import load_suite
    from ragpipe.experiment.gate_policy import load_policy
    from ragpipe.release.targets import load_targets
    from ragpipe.spec import load_pipeline_spec

    section = load_pipeline_spec(folder / "pipeline.yaml").evaluation
    if section is None or (section.suite, section.gate_policy) != (
        (folder / SUITE).resolve(),
        (folder / POLICY).resolve(),
    ):
        raise RuntimeError(f"{folder / 'pipeline.yaml'}: its evaluation section does not name {SUITE} and {POLICY}")
    load_suite(section.suite)
    policy = load_policy(section.gate_policy)
    targets = load_targets(folder / "targets.yaml")
    for name in targets.targets:
        if policy.policy_id not in targets.accepted_policies(name):
            raise RuntimeError(f"{folder / 'targets.yaml'}: target {name!r} does not accept {POLICY}")


def init(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A new or empty folder for the project.")],
) -> None:
    """Make a project for your own corpus in DIR: pipeline spec, gate policy, targets and an empty suite."""
    folder = Path(os.path.abspath(directory))
    if folder.exists() and not folder.is_dir():
        fail(f"{directory} exists and is not a folder: ragpipe init writes a project into a new or empty folder")
    if folder.is_dir() and any(folder.iterdir()):
        fail(f"{directory} is not empty: ragpipe init writes a project into a new or empty folder")
    folder.parent.mkdir(parents=True, exist_ok=True)
    files = project_files(folder)
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()  # mode from the umask, as the folder would have had
        for name, (text, _) in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        check_project(tmp)
        if folder.is_dir():  # an existing empty folder (perhaps the caller's cwd) stays the same inode
            for name in files:
                os.replace(tmp / name, folder / name)
            tmp.rmdir()
        else:
            os.replace(tmp, folder)  # no folder yet: complete or absent
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        fail(f"cannot write the project to {directory}: {exc}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name, (_, what) in files.items():
        typer.echo(f"wrote {folder / name}  {what}")
    typer.echo("next:")
    for line in (
        *exports(folder).splitlines(),
        "ragpipe build CORPUS --revision KEY [--default-scope SCOPE]",
        'ragpipe query --revision KEY "..."',
    ):
        typer.echo(f"  {line}")
