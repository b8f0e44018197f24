"""Every ``RAGPIPE_*`` environment variable, read in one place and checked as a whole.

``Settings.from_environ()`` is the only reader of ``RAGPIPE_*`` names in ragpipe (the boundary
test enforces it). It reads each variable once, checks all of them, and either returns a frozen
``Settings`` or raises one ``SettingsError`` whose message has one line per problem, in
``VARIABLES`` order (unknown names last, sorted)::

    RAGPIPE_EXECUTOR: 'threads': must be one of in_process, celery, k8s
    RAGPIPE_EMBEDDING_SHARDS='0': must be an integer from 1 to 64
    RAGPIPE_CELERY_WAIT_REPORT_S: '-1': must be a number of seconds, 0 or more
    RAGPIPE_BUNDLE_KEY: key has 5 bytes, at least 32 are required
    RAGPIPE_BUNDLE_KEY is set but empty: set the key, or unset it
    both RAGPIPE_BUNDLE_KEY and RAGPIPE_BUNDLE_KEY_FILE are set: configure one key
    RAGPIPE_WORKSPACE: renamed to RAGPIPE_DAGSTER_WORKSPACE (docs/configuration.md)
    RAGPIPE_HOEM: not a ragpipe variable (did you mean RAGPIPE_HOME?)

A secret (``RAGPIPE_BUNDLE_KEY``, the API keys) never appears in a message or a ``repr``.

Rules shared by every variable: a variable set to the empty string counts as unset (the
default), except the bundle key pair, where "set but empty" is an error and never "no key".
Paths are kept as written: a relative path is relative to the working directory of the process
that uses it, as it always was (the settings of a long-lived process may be read before it
changes folder). Values are never part of an ID (docs/architecture.md).

What stays with its own module: the meaning of ``RAGPIPE_STORE`` (a folder, ``file://`` or
``s3://`` location, ``ragpipe.storage.location``), reading the key file
(``ragpipe.kernel.seals.configured_key``) and what each executor needs besides its name
(``ragpipe.stages.configuration``) — they are checked where they are used, with their own errors.

Entry points (CLI commands, the Dagster code location, ``ragpipe serve``) call ``from_environ``
once; library code below them that has no settings passed in calls ``current_settings()``, which
re-reads only when a ``RAGPIPE_*`` variable changed.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, SecretBytes, SecretStr

PREFIX = "RAGPIPE_"
EXECUTORS = ("in_process", "celery", "k8s")
MAX_SHARDS = 64
MIN_KEY_BYTES = 32
RENAMED = {"RAGPIPE_WORKSPACE": "RAGPIPE_DAGSTER_WORKSPACE"}


class SettingsError(ValueError):
    """The environment's ``RAGPIPE_*`` variables are refused: ``problems``, one line each, and
    ``str(e)`` those lines joined with a line break."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems

    def one_line(self) -> str:
        """The problems joined with ``; ``, for errors whose contract is one line."""
        return "; ".join(self.problems)


class Variable(BaseModel):
    """One row of docs/configuration.md: the variable, the ``Settings`` field it fills, the
    default as the page shows it, what it means and what reads it."""

    model_config = ConfigDict(frozen=True)

    name: str
    field: str
    default: str
    meaning: str
    read_by: str


def _v(name: str, field: str, default: str, meaning: str, read_by: str) -> Variable:
    return Variable(name=name, field=field, default=default, meaning=meaning, read_by=read_by)


VARIABLES: tuple[Variable, ...] = (
    _v("RAGPIPE_HOME", "home", "var/ragpipe", "the runtime state folder (the workspace)", "every command; the code location"),
    _v("RAGPIPE_STORE", "store", "(unset: local only)", "the object store: a folder, file:// or s3:// location", "build, release, serve; the code location"),
    _v("RAGPIPE_S3_ENDPOINT", "s3_endpoint", "(unset: AWS itself)", "an http(s) URL of an S3-compatible endpoint", "whatever opens an s3:// store"),
    _v("RAGPIPE_BUNDLE_KEY", "bundle_key", "(unset: no key)", "the sealing key itself (secret, 32 bytes or more)", "every seal and verification"),
    _v("RAGPIPE_BUNDLE_KEY_FILE", "bundle_key_file", "(unset: no key)", "a file whose bytes are the sealing key", "every seal and verification"),
    _v("RAGPIPE_PIPELINE_SPEC", "pipeline_spec", "ragpipe/specs/pipeline.yaml", "the pipeline spec a build uses", "build, candidate, the code location"),
    _v("RAGPIPE_TARGETS", "targets", "ragpipe/specs/targets.yaml", "the release targets file", "build, release, serve; the code location"),
    _v("RAGPIPE_SOURCES", "sources", "ragpipe/specs/sources.yaml", "the watched corpus sources", "the nightly_rebuild schedule"),
    _v("RAGPIPE_PRICES", "prices", "ragpipe/specs/prices.yaml", "the model price table (budgets, costs)", "embedding, generation, eval, dataset draft"),
    _v("RAGPIPE_LLM_API_KEY", "llm_api_key", "(unset: provider's own variable)", "the API key for chat models (secret)", "answer, eval judge, dataset draft"),
    _v("RAGPIPE_EMBEDDER_API_KEY", "embedder_api_key", "(unset: provider's own variable)", "the API key for a remote embedder (secret)", "the embeddings asset, query"),
    _v("RAGPIPE_EMBEDDER_PATH", "embedder_path", "(unset: none)", "folders holding pinned model folders, os.pathsep-separated", "whatever loads a pinned model: build, query, eval"),
    _v("RAGPIPE_EXECUTOR", "executor", "in_process", "what runs a job's steps: in_process, celery or k8s", "the code location; build"),
    _v("RAGPIPE_CELERY_BROKER", "celery_broker", "(unset)", "the Celery broker URL (needed by celery)", "the code location at launch"),
    _v("RAGPIPE_CELERY_BACKEND", "celery_backend", "(unset)", "the Celery result backend URL (needed by celery)", "the code location at launch"),
    _v("RAGPIPE_CELERY_WAIT_REPORT_S", "celery_wait_report_s", "30", "seconds before a step no worker took is reported waiting", "the celery executor"),
    _v("RAGPIPE_K8S_IMAGE", "k8s_image", "(unset)", "the step image (needed by k8s)", "the k8s executor at launch"),
    _v("RAGPIPE_K8S_NAMESPACE", "k8s_namespace", "(unset)", "the step namespace (needed by k8s)", "the k8s executor at launch"),
    _v("RAGPIPE_EMBEDDING_SHARDS", "embedding_shards", "1", "embedding steps per build, an integer from 1 to 64", "the code location; build"),
    _v("RAGPIPE_DAGSTER_WORKSPACE", "dagster_workspace", "workspace.yaml beside the ragpipe package", "Dagster's workspace.yaml that defines the ragpipe location", "build (in process or queued)"),
)  # fmt: skip
BY_NAME = {v.name: v for v in VARIABLES}


class Settings(BaseModel):
    """The checked values of every ``RAGPIPE_*`` variable; ``None``: unset (the module that uses
    it supplies its own default, shown in ``VARIABLES``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Path("var") / "ragpipe"
    store: str | None = None
    s3_endpoint: str | None = None
    bundle_key: SecretBytes | None = None
    bundle_key_file: Path | None = None
    pipeline_spec: Path | None = None
    targets: Path | None = None
    sources: Path | None = None
    prices: Path | None = None
    llm_api_key: SecretStr | None = None
    embedder_api_key: SecretStr | None = None
    embedder_path: tuple[Path, ...] = ()
    executor: Literal["in_process", "celery", "k8s"] = "in_process"
    celery_broker: str | None = None
    celery_backend: str | None = None
    celery_wait_report_s: float = 30.0
    k8s_image: str | None = None
    k8s_namespace: str | None = None
    embedding_shards: int = 1
    dagster_workspace: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings in ``environ`` (default: this process's environment, read as bytes so a
        key that is not UTF-8 stays exactly its bytes); ``SettingsError`` lists every problem."""
        if environ is None:
            raw = {os.fsdecode(k): v for k, v in os.environb.items() if k.startswith(PREFIX.encode())}
        else:
            raw = {k: os.fsencode(v) for k, v in environ.items() if k.startswith(PREFIX)}
        return _parse(raw)

    def as_environ(self) -> dict[str, str]:
        """The variables that give these settings back (``from_environ(s.as_environ()) == s``);
        a value equal to its default is left out. Secrets are included: for a child's environment."""
        out: dict[str, str] = {}
        for var in VARIABLES:
            value = getattr(self, var.field)
            if value == Settings.model_fields[var.field].default:
                continue
            if isinstance(value, SecretBytes):
                out[var.name] = os.fsdecode(value.get_secret_value())
            elif isinstance(value, SecretStr):
                out[var.name] = value.get_secret_value()
            elif var.field == "embedder_path":
                out[var.name] = os.pathsep.join(map(str, value))
            elif isinstance(value, float):
                out[var.name] = repr(value)
            else:
                out[var.name] = str(value)
        return out


def _parse(raw: dict[str, bytes]) -> Settings:
    problems: list[str] = []
    values: dict[str, object] = {}
    text = {name: os.fsdecode(value) for name, value in raw.items()}
    given = {name: value for name, value in text.items() if value.strip()}

    def path(name: str, field: str) -> None:
        if name in given:
            values[field] = Path(given[name])

    def string(name: str, field: str) -> None:
        if name in given:
            values[field] = given[name]

    path("RAGPIPE_HOME", "home")
    string("RAGPIPE_STORE", "store")
    string("RAGPIPE_S3_ENDPOINT", "s3_endpoint")
    problems += _bundle_key(raw, values)
    for name, field in (
        ("RAGPIPE_PIPELINE_SPEC", "pipeline_spec"),
        ("RAGPIPE_TARGETS", "targets"),
        ("RAGPIPE_SOURCES", "sources"),
        ("RAGPIPE_PRICES", "prices"),
        ("RAGPIPE_DAGSTER_WORKSPACE", "dagster_workspace"),
    ):
        path(name, field)
    for name, field in (("RAGPIPE_LLM_API_KEY", "llm_api_key"), ("RAGPIPE_EMBEDDER_API_KEY", "embedder_api_key")):
        if text.get(name):
            values[field] = SecretStr(text[name])
    if "RAGPIPE_EMBEDDER_PATH" in given:
        parts = (p.strip() for p in given["RAGPIPE_EMBEDDER_PATH"].split(os.pathsep))
        values["embedder_path"] = tuple(Path(p).expanduser() for p in parts if p)
    if "RAGPIPE_EXECUTOR" in given:
        name = given["RAGPIPE_EXECUTOR"]
        if name in EXECUTORS:
            values["executor"] = name
        else:
            problems.append(f"RAGPIPE_EXECUTOR: {name!r}: must be one of {', '.join(EXECUTORS)}")
    for name, field in (
        ("RAGPIPE_CELERY_BROKER", "celery_broker"),
        ("RAGPIPE_CELERY_BACKEND", "celery_backend"),
        ("RAGPIPE_K8S_IMAGE", "k8s_image"),
        ("RAGPIPE_K8S_NAMESPACE", "k8s_namespace"),
    ):
        string(name, field)
    if "RAGPIPE_CELERY_WAIT_REPORT_S" in given:
        wait = given["RAGPIPE_CELERY_WAIT_REPORT_S"]
        try:
            seconds = float(wait)
        except ValueError:
            seconds = float("nan")
        if seconds >= 0 and seconds != float("inf"):
            values["celery_wait_report_s"] = seconds
        else:
            problems.append(f"RAGPIPE_CELERY_WAIT_REPORT_S: {wait!r}: must be a number of seconds, 0 or more")
    if "RAGPIPE_EMBEDDING_SHARDS" in given:
        shards = given["RAGPIPE_EMBEDDING_SHARDS"].strip()
        if shards.isascii() and shards.isdigit() and 1 <= int(shards) <= MAX_SHARDS:
            values["embedding_shards"] = int(shards)
        else:
            problems.append(f"RAGPIPE_EMBEDDING_SHARDS={shards!r}: must be an integer from 1 to {MAX_SHARDS}")
    problems += _unknown(sorted(set(raw) - set(BY_NAME)))
    if problems:
        raise SettingsError(problems)
    return Settings.model_validate(values)


def _bundle_key(raw: dict[str, bytes], values: dict[str, object]) -> list[str]:
    """The key pair's rules that need no file read (the key file is read by ``seals``)."""
    inline, path = raw.get("RAGPIPE_BUNDLE_KEY"), raw.get("RAGPIPE_BUNDLE_KEY_FILE")
    if inline is not None and path is not None:
        return ["both RAGPIPE_BUNDLE_KEY and RAGPIPE_BUNDLE_KEY_FILE are set: configure one key"]
    if path is not None:
        if not path:
            return ["RAGPIPE_BUNDLE_KEY_FILE is set but empty: name the key file, or unset it"]
        values["bundle_key_file"] = Path(os.fsdecode(path))
    if inline is not None:
        if not inline:
            return ["RAGPIPE_BUNDLE_KEY is set but empty: set the key, or unset it"]
        if len(inline) < MIN_KEY_BYTES:
            return [f"RAGPIPE_BUNDLE_KEY: key has {len(inline)} bytes, at least {MIN_KEY_BYTES} are required"]
        values["bundle_key"] = SecretBytes(inline)
    return []


def _unknown(names: list[str]) -> list[str]:
    lines = []
    for name in names:
        if name in RENAMED:
            lines.append(f"{name}: renamed to {RENAMED[name]} (docs/configuration.md)")
            continue
        close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}?" if close else "docs/configuration.md lists them"
        lines.append(f"{name}: not a ragpipe variable ({hint})")
    return lines


def current_settings() -> Settings:
    """``Settings.from_environ()`` of this process, read again only when a ``RAGPIPE_*``
    variable changed since the last call. For library code that was given no settings; entry
    points call ``from_environ`` themselves and pass the result down."""
    snapshot = tuple(sorted((k, v) for k, v in os.environb.items() if k.startswith(PREFIX.encode())))
    return _cached(snapshot)


@functools.lru_cache(maxsize=8)
def _cached(snapshot: tuple[tuple[bytes, bytes], ...]) -> Settings:
    return _parse({os.fsdecode(k): v for k, v in snapshot})
