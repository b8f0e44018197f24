"""``Settings``: every ``RAGPIPE_*`` variable read once, checked together, one line per problem;
docs/configuration.md lists exactly ``VARIABLES``."""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretBytes, SecretStr

from ragpipe.kernel.settings import VARIABLES, Settings, SettingsError, current_settings
from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe_tests.support.paths import REPO

KEY = "k" * 32


def test_nothing_set_is_every_default():
    settings = Settings.from_environ({})
    assert settings == Settings()
    assert (settings.home, settings.store, settings.executor, settings.embedding_shards) == (
        Path("var/ragpipe"),
        None,
        "in_process",
        1,
    )
    assert (settings.celery_wait_report_s, settings.embedder_path, settings.bundle_key) == (30.0, (), None)
    assert Settings.from_environ({"PATH": "/bin", "HOME": "/root"}) == Settings()  # not ours: ignored


def test_every_variable_is_parsed(tmp_path: Path):
    environ = {
        "RAGPIPE_HOME": "rel/home",
        "RAGPIPE_STORE": "s3://bucket/prefix",
        "RAGPIPE_S3_ENDPOINT": "http://127.0.0.1:9000",
        "RAGPIPE_BUNDLE_KEY": KEY,
        "RAGPIPE_PIPELINE_SPEC": "/srv/pipeline.yaml",
        "RAGPIPE_TARGETS": "targets.yaml",
        "RAGPIPE_SOURCES": "/srv/sources.yaml",
        "RAGPIPE_PRICES": "/srv/prices.yaml",
        "RAGPIPE_LLM_API_KEY": "llm-secret",
        "RAGPIPE_EMBEDDER_API_KEY": "embedder-secret",
        "RAGPIPE_EMBEDDER_PATH": f"/models{os.pathsep} /more {os.pathsep}",
        "RAGPIPE_EXECUTOR": "celery",
        "RAGPIPE_CELERY_BROKER": "redis://127.0.0.1:6379/0",
        "RAGPIPE_CELERY_BACKEND": "redis://127.0.0.1:6379/1",
        "RAGPIPE_CELERY_WAIT_REPORT_S": "2.5",
        "RAGPIPE_K8S_IMAGE": "registry.example/ragpipe:0.1.0",
        "RAGPIPE_K8S_NAMESPACE": "ragpipe",
        "RAGPIPE_EMBEDDING_SHARDS": " 3 ",
        "RAGPIPE_DAGSTER_WORKSPACE": "/srv/workspace.yaml",
    }
    assert {v.name for v in VARIABLES} - set(environ) == {"RAGPIPE_BUNDLE_KEY_FILE"}
    assert Settings.from_environ(environ) == Settings(
        home=Path("rel/home"),
        store="s3://bucket/prefix",
        s3_endpoint="http://127.0.0.1:9000",
        bundle_key=SecretBytes(KEY.encode()),
        pipeline_spec=Path("/srv/pipeline.yaml"),
        targets=Path("targets.yaml"),
        sources=Path("/srv/sources.yaml"),
        prices=Path("/srv/prices.yaml"),
        llm_api_key=SecretStr("llm-secret"),
        embedder_api_key=SecretStr("embedder-secret"),
        embedder_path=(Path("/models"), Path("/more")),
        executor="celery",
        celery_broker="redis://127.0.0.1:6379/0",
        celery_backend="redis://127.0.0.1:6379/1",
        celery_wait_report_s=2.5,
        k8s_image="registry.example/ragpipe:0.1.0",
        k8s_namespace="ragpipe",
        embedding_shards=3,
        dagster_workspace=Path("/srv/workspace.yaml"),
    )
    key_file = Settings.from_environ({"RAGPIPE_BUNDLE_KEY_FILE": str(tmp_path / "bundle.key")})
    assert key_file.bundle_key_file == tmp_path / "bundle.key"


def test_a_relative_path_is_kept_as_written_and_the_home_resolves_where_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_environ({"RAGPIPE_HOME": "state", "RAGPIPE_TARGETS": "conf/targets.yaml"})
    assert (settings.home, settings.targets) == (Path("state"), Path("conf/targets.yaml"))
    assert default_home(settings) == tmp_path / "state"
    assert Workspace.of(settings) == Workspace(tmp_path / "state")


@pytest.mark.parametrize("name", [v.name for v in VARIABLES if not v.name.startswith("RAGPIPE_BUNDLE_KEY")])
def test_an_empty_variable_is_its_default(name: str):
    assert Settings.from_environ({name: ""}) == Settings()


@pytest.mark.parametrize(
    ("environ", "line"),
    [
        ({"RAGPIPE_EXECUTOR": "threads"}, "RAGPIPE_EXECUTOR: 'threads': must be one of in_process, celery, k8s"),
        ({"RAGPIPE_EXECUTOR": "Celery"}, "RAGPIPE_EXECUTOR: 'Celery': must be one of in_process, celery, k8s"),
        ({"RAGPIPE_EMBEDDING_SHARDS": "three"}, "RAGPIPE_EMBEDDING_SHARDS='three': must be an integer from 1 to 64"),
        ({"RAGPIPE_EMBEDDING_SHARDS": "0"}, "RAGPIPE_EMBEDDING_SHARDS='0': must be an integer from 1 to 64"),
        ({"RAGPIPE_EMBEDDING_SHARDS": "65"}, "RAGPIPE_EMBEDDING_SHARDS='65': must be an integer from 1 to 64"),
        ({"RAGPIPE_EMBEDDING_SHARDS": "-2"}, "RAGPIPE_EMBEDDING_SHARDS='-2': must be an integer from 1 to 64"),
        ({"RAGPIPE_EMBEDDING_SHARDS": "²"}, "RAGPIPE_EMBEDDING_SHARDS='²': must be an integer from 1 to 64"),
        (
            {"RAGPIPE_CELERY_WAIT_REPORT_S": "-1"},
            "RAGPIPE_CELERY_WAIT_REPORT_S: '-1': must be a number of seconds, 0 or more",
        ),
        (
            {"RAGPIPE_CELERY_WAIT_REPORT_S": "soon"},
            "RAGPIPE_CELERY_WAIT_REPORT_S: 'soon': must be a number of seconds, 0 or more",
        ),
        (
            {"RAGPIPE_CELERY_WAIT_REPORT_S": "nan"},
            "RAGPIPE_CELERY_WAIT_REPORT_S: 'nan': must be a number of seconds, 0 or more",
        ),
        (
            {"RAGPIPE_CELERY_WAIT_REPORT_S": "inf"},
            "RAGPIPE_CELERY_WAIT_REPORT_S: 'inf': must be a number of seconds, 0 or more",
        ),
        ({"RAGPIPE_BUNDLE_KEY": "short"}, "RAGPIPE_BUNDLE_KEY: key has 5 bytes, at least 32 are required"),
        ({"RAGPIPE_BUNDLE_KEY": ""}, "RAGPIPE_BUNDLE_KEY is set but empty: set the key, or unset it"),
        ({"RAGPIPE_BUNDLE_KEY_FILE": ""}, "RAGPIPE_BUNDLE_KEY_FILE is set but empty: name the key file, or unset it"),
        (
            {"RAGPIPE_BUNDLE_KEY": KEY, "RAGPIPE_BUNDLE_KEY_FILE": "/k"},
            "both RAGPIPE_BUNDLE_KEY and RAGPIPE_BUNDLE_KEY_FILE are set: configure one key",
        ),
        (
            {"RAGPIPE_WORKSPACE": "/srv/workspace.yaml"},
            "RAGPIPE_WORKSPACE: renamed to RAGPIPE_DAGSTER_WORKSPACE (docs/configuration.md)",
        ),
        ({"RAGPIPE_HOEM": "/srv"}, "RAGPIPE_HOEM: not a ragpipe variable (did you mean RAGPIPE_HOME?)"),
        ({"RAGPIPE_EXECUTER": "celery"}, "RAGPIPE_EXECUTER: not a ragpipe variable (did you mean RAGPIPE_EXECUTOR?)"),
        ({"RAGPIPE_COLOR": "1"}, "RAGPIPE_COLOR: not a ragpipe variable (docs/configuration.md lists them)"),
    ],
)
def test_each_bad_value_is_one_exact_line(environ: dict[str, str], line: str):
    with pytest.raises(SettingsError) as info:
        Settings.from_environ(environ)
    assert (info.value.problems, str(info.value), info.value.one_line()) == ([line], line, line)


def test_every_problem_at_once_one_line_each_in_table_order():
    environ = {
        "RAGPIPE_ZZZ": "1",
        "RAGPIPE_EMBEDDING_SHARDS": "0",
        "RAGPIPE_WORKSPACE": "w.yaml",
        "RAGPIPE_EXECUTOR": "threads",
        "RAGPIPE_BUNDLE_KEY": "short",
        "RAGPIPE_CELERY_WAIT_REPORT_S": "-1",
        "RAGPIPE_HOME": "fine",
    }
    with pytest.raises(SettingsError) as info:
        Settings.from_environ(environ)
    lines = [
        "RAGPIPE_BUNDLE_KEY: key has 5 bytes, at least 32 are required",
        "RAGPIPE_EXECUTOR: 'threads': must be one of in_process, celery, k8s",
        "RAGPIPE_CELERY_WAIT_REPORT_S: '-1': must be a number of seconds, 0 or more",
        "RAGPIPE_EMBEDDING_SHARDS='0': must be an integer from 1 to 64",
        "RAGPIPE_WORKSPACE: renamed to RAGPIPE_DAGSTER_WORKSPACE (docs/configuration.md)",
        "RAGPIPE_ZZZ: not a ragpipe variable (docs/configuration.md lists them)",
    ]
    assert str(info.value).splitlines() == lines
    assert info.value.one_line() == "; ".join(lines)


def test_secrets_are_in_no_repr_str_or_error():
    secrets = {"RAGPIPE_BUNDLE_KEY": "B" * 40, "RAGPIPE_LLM_API_KEY": "sk-llm-1234", "RAGPIPE_EMBEDDER_API_KEY": "sk-e"}
    settings = Settings.from_environ(secrets)
    shown = repr(settings) + str(settings) + settings.model_dump_json()
    assert [s for s in secrets.values() if s in shown] == []
    assert settings.llm_api_key is not None and settings.llm_api_key.get_secret_value() == "sk-llm-1234"
    with pytest.raises(SettingsError) as info:
        Settings.from_environ({**secrets, "RAGPIPE_BUNDLE_KEY": "short-secret", "RAGPIPE_EXECUTOR": "x"})
    assert "short-secret" not in str(info.value) and "sk-llm-1234" not in str(info.value)


def test_the_process_environment_is_read_as_bytes_and_reread_when_it_changes(monkeypatch: pytest.MonkeyPatch):
    for name in [n for n in os.environ if n.startswith("RAGPIPE_")]:
        monkeypatch.delenv(name)
    assert current_settings() == Settings()
    key = b"\xff\xfe" + b"k" * 30  # not UTF-8: the key is exactly these bytes
    monkeypatch.setitem(os.environb, b"RAGPIPE_BUNDLE_KEY", key)
    monkeypatch.setenv("RAGPIPE_EMBEDDING_SHARDS", "4")
    settings = current_settings()
    assert settings.bundle_key is not None and settings.bundle_key.get_secret_value() == key
    assert (settings.embedding_shards, Settings.from_environ()) == (4, settings)
    monkeypatch.setenv("RAGPIPE_EMBEDDING_SHARDS", "x")
    with pytest.raises(SettingsError, match=r"^RAGPIPE_EMBEDDING_SHARDS='x': must be an integer from 1 to 64$"):
        current_settings()


def test_variables_name_every_field_once():
    assert sorted(v.field for v in VARIABLES) == sorted(Settings.model_fields)
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)
    assert all(v.name.startswith("RAGPIPE_") for v in VARIABLES)


def documented_variables(text: str) -> list[tuple[str, str, str, str]]:
    """The rows of the "Variables" table of docs/configuration.md: (name, default, meaning, read by)."""
    section = text.split("\n## Variables\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`RAGPIPE_[A-Z0-9_]+`", cells[0]):
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2], cells[3]))
    return rows


def test_the_configuration_page_lists_exactly_the_variables():
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert documented_variables(page) == [(v.name, v.default, v.meaning, v.read_by) for v in VARIABLES]


def test_the_page_parser_reads_rows_and_skips_the_rest():
    text = "# C\n\n## Variables\n\n| Variable | Default |\n|---|---|\n| `RAGPIPE_A` | `1` | one | build |\n\n## Next\n| `RAGPIPE_B` | `2` | b | c |\n"
    assert documented_variables(text) == [("RAGPIPE_A", "1", "one", "build")]


_WORD = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)
_PATH = st.lists(_WORD, min_size=1, max_size=3).map(lambda parts: Path("/".join(parts)))
_URL = _WORD.map(lambda w: f"redis://{w}/0")
_SECRET = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1)


@st.composite
def settings_values(draw) -> Settings:
    key = draw(
        st.sampled_from(["none", "inline", "file"]).flatmap(
            lambda kind: (
                st.just({})
                if kind == "none"
                else st.builds(
                    lambda b: {"bundle_key": SecretBytes(b)},
                    st.binary(min_size=32, max_size=48).filter(lambda b: b"\0" not in b),
                )
                if kind == "inline"
                else _PATH.map(lambda p: {"bundle_key_file": p})
            )
        )
    )
    optional = {
        "store": st.none() | _WORD.map(lambda w: f"s3://{w.lower()}"),
        "s3_endpoint": st.none() | _WORD.map(lambda w: f"http://{w}"),
        "pipeline_spec": st.none() | _PATH,
        "targets": st.none() | _PATH,
        "sources": st.none() | _PATH,
        "prices": st.none() | _PATH,
        "dagster_workspace": st.none() | _PATH,
        "llm_api_key": st.none() | _SECRET.map(SecretStr),
        "embedder_api_key": st.none() | _SECRET.map(SecretStr),
        "celery_broker": st.none() | _URL,
        "celery_backend": st.none() | _URL,
        "k8s_image": st.none() | _WORD,
        "k8s_namespace": st.none() | _WORD,
    }
    values = {field: draw(strategy) for field, strategy in optional.items()}
    return Settings(
        home=draw(_PATH),
        embedder_path=tuple(draw(st.lists(_PATH, max_size=3))),
        executor=draw(st.sampled_from(["in_process", "celery", "k8s"])),
        celery_wait_report_s=draw(st.floats(min_value=0, max_value=1e9, allow_nan=False)),
        embedding_shards=draw(st.integers(1, 64)),
        **values,
        **key,
    )


@given(settings_values())
def test_settings_survive_their_environment(settings: Settings):
    assert Settings.from_environ(settings.as_environ()) == settings
