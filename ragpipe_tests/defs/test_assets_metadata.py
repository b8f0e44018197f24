"""The graph as a Dagster user sees it: typed metadata, owners and tags, pools, backfill policy,
executor, and no avoidable warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import (
    AssetKey,
    BackfillPolicy,
    DagsterInstance,
    FloatMetadataValue,
    IntMetadataValue,
    MarkdownMetadataValue,
    PathMetadataValue,
    TableMetadataValue,
    TableSchema,
)

from ragpipe.bundle.verify import open_bundle
from ragpipe.corpus.registry import load_revision, register_revision
from ragpipe.defs import build_definitions
from ragpipe.defs.assets import POOLS
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import DEFAULT_SPEC_PATH, PipelineSpecError, load_pipeline_spec
from ragpipe.stages.results import Table, table
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO

ASSETS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
TABULAR = ASSETS[:-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """One real run of build_revision for the handbook: (workspace, run result)."""
    root = tmp_path_factory.mktemp("meta")
    home = root / "ragpipe"
    register_revision(home / "revisions", "hb", write_tree(root / "hb", HANDBOOK), "markdown", "public")
    (root / "dagster").mkdir()
    with pytest.MonkeyPatch.context() as mp, DagsterInstance.local_temp(str(root / "dagster")) as instance:
        mp.setenv("RAGPIPE_HOME", str(home))
        instance.add_dynamic_partitions("corpus_revisions", ["hb"])
        result = (
            build_definitions()
            .resolve_job_def("build_revision")
            .execute_in_process(partition_key="hb", instance=instance)
        )
        yield Workspace(home), result


def materialization(result, name: str) -> dict:
    [m] = result.asset_materializations_for_node(name)
    return dict(m.metadata)


def test_tabular_assets_report_their_row_count(built):
    ws, result = built
    expected = {
        "source_snapshot": read_stage_record(ws, "hb", "source_snapshot").facts["documents"],
        "chunks": read_stage_record(ws, "hb", "chunks").facts["chunks"],
        "representations": read_stage_record(ws, "hb", "representations").facts["representations"],
        "embeddings": read_stage_record(ws, "hb", "representations").facts["representations"],
        "lexical_index": read_stage_record(ws, "hb", "lexical_index").facts["documents"],
        "vector_index": read_stage_record(ws, "hb", "vector_index").facts["rows"],
    }
    assert expected["source_snapshot"] == 3  # notes/short.md is excluded (too short)
    for name in TABULAR:
        value = materialization(result, name)["dagster/row_count"]
        assert isinstance(value, IntMetadataValue) and value.value == expected[name], name
    assert "dagster/row_count" not in materialization(result, "index_bundle")


def test_metadata_is_typed_tables_paths_and_seconds(built):
    ws, result = built
    for name in ASSETS:
        meta = materialization(result, name)
        assert not [k for k, v in meta.items() if isinstance(v, MarkdownMetadataValue)], name
        assert isinstance(meta["duration_seconds"], FloatMetadataValue) and meta["duration_seconds"].value >= 0, name
        record = read_stage_record(ws, "hb", name)
        assert meta["output_path"] == PathMetadataValue(
            str(ws.stage_dir("hb", name) / record.data_version.split(":")[1])
        )
        assert "seconds" not in meta and "none" not in [getattr(v, "value", None) for v in meta.values()], name
        for key, value in meta.items():
            if isinstance(value, TableMetadataValue):
                assert isinstance(value.schema, TableSchema) and value.schema.columns, (name, key)
                columns = [c.name for c in value.schema.columns]
                assert value.records, (name, key)
                assert all(list(r.data) == columns and None not in r.data.values() for r in value.records), (name, key)
    snap = materialization(result, "source_snapshot")
    assert snap["source"] == PathMetadataValue(load_revision(ws.registry, "hb").source_path)
    assert snap["excluded"].value == 1
    [excluded] = snap["excluded_documents"].records
    assert excluded.data == {
        "document": "notes/short.md",
        "location": str(Path(load_revision(ws.registry, "hb").source_path) / "notes/short.md"),
        "reason": "text shorter than min_text_chars=20",
    }
    assert [(r.data["scope"], r.data["documents"]) for r in snap["access_scopes"].records] == [
        ("public", 2),
        ("staff", 1),
    ]
    assert [r.data["kind"] for r in materialization(result, "representations")["kinds"].records] == [
        "raw",
        "title_breadcrumb",
    ]
    bundle = materialization(result, "index_bundle")
    assert bundle["bundle_path"] == PathMetadataValue(
        str(ws.located(str(read_stage_record(ws, "hb", "index_bundle").facts["bundle_path"])))
    )
    assert bundle["bundle_id"].value == read_stage_record(ws, "hb", "index_bundle").data_version
    manifest = open_bundle(Path(bundle["bundle_path"].path)).manifest
    assert [(r.data["stage"], r.data["spec_id"]) for r in bundle["specs"].records] == [
        (k, v.spec_id) for k, v in manifest.semantic.specs.items()
    ]
    emb = materialization(result, "embeddings")
    assert (emb["encoded"].value, emb["cache_hits"].value) == (emb["unique_texts"].value, 0)
    assert "run_attempt" not in bundle  # only runs requested by the sensor carry an attempt


def test_check_metadata_has_no_placeholders(built):
    ws, result = built
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    # the checked-in spec has an evaluation: section, so the chain's check runs too
    assert set(evaluations) == {"chunks_match_source", "bundle_verifies", "evaluation_ledger_verifies"}
    for e in evaluations.values():
        assert e.passed
        assert not [k for k, v in e.metadata.items() if isinstance(v, MarkdownMetadataValue)]
        assert "first_problems" not in e.metadata and e.metadata["problems"].value == 0
    assert evaluations["bundle_verifies"].metadata["bundle_path"] == PathMetadataValue(
        str(ws.located(str(read_stage_record(ws, "hb", "index_bundle").facts["bundle_path"])))
    )


def test_tables_refuse_rows_that_do_not_fit_their_schema():
    assert table([("scope", "string")], []) is None
    assert table([("n", "int")], [[1], [2], [3]], limit=2) == Table((("n", "int"),), ({"n": 1}, {"n": 2}))
    with pytest.raises(ValueError) as info:
        Table((("n", "int"),), ({"n": "1"},))
    assert str(info.value) == "table column 'n' is int, got '1'"
    with pytest.raises(ValueError) as info:
        Table((("n", "int"),), ({"m": 1},))
    assert str(info.value) == "table row {'m': 1} does not have exactly the columns ['n']"
    with pytest.raises(ValueError) as info:
        Table((("n", "decimal"),), ())
    assert str(info.value) == "table column 'n': unknown type 'decimal'"


def test_owners_and_tags_come_from_the_spec_dagster_section():
    spec = load_pipeline_spec()
    raw = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))["dagster"]
    graph = build_definitions(spec).resolve_asset_graph()
    for name in ASSETS:
        node = graph.get(AssetKey(name))
        extra = raw.get("assets", {}).get(name, {})
        assert list(node.owners) == raw["owners"] + extra.get("owners", []), name
        user_tags = {k: v for k, v in node.tags.items() if not k.startswith("dagster/")}
        assert user_tags == {**raw["tags"], **extra.get("tags", {})}, name
    assert spec.dagster.tags_for("embeddings") == {"domain": "retrieval", "compute": "torch"}


def test_the_dagster_section_enters_no_spec_id(tmp_path: Path):
    base = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))
    # the copies live elsewhere: make the evaluation suite path (relative to the spec file) absolute
    base["evaluation"] = {
        **base["evaluation"],
        "suite": str((DEFAULT_SPEC_PATH.parent / base["evaluation"]["suite"]).resolve()),
    }
    other = {
        **base,
        "dagster": {
            "owners": ["someone@example.com"],
            "tags": {"tier": "gold"},
            "assets": {"chunks": {"owners": ["team:x"]}},
        },
    }
    bare = {k: v for k, v in base.items() if k != "dagster"}
    specs = []
    for i, raw in enumerate([base, other, bare]):
        (tmp_path / f"{i}.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
        specs.append(load_pipeline_spec(tmp_path / f"{i}.yaml"))
    assert specs[1].dagster != specs[0].dagster
    for s in specs[1:]:
        assert s.spec_ids == specs[0].spec_ids and s.own_spec_ids == specs[0].own_spec_ids
    versions = [
        {n: build_definitions(s).resolve_asset_graph().get(AssetKey(n)).code_version for n in ASSETS} for s in specs
    ]
    assert versions[0] == versions[1] == versions[2] == dict(specs[0].spec_ids)
    assert build_definitions(specs[1]).resolve_asset_graph().get(AssetKey("chunks")).owners == [
        "someone@example.com",
        "team:x",
    ]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"owners": ["search"]}, "owner 'search' must be an email address or 'team:<name>'"),
        (
            {"tags": {"domain": "two words"}},
            "tag 'domain': value 'two words' must be a string matching ^[A-Za-z0-9_.-]{0,63}$",
        ),
        ({"tags": {"bad key": "x"}}, "tag key 'bad key' must match ^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$"),
        ({"assets": {"chunk": {}}}, "Input should be 'source_snapshot', 'chunks', 'representations'"),
    ],
)
def test_bad_dagster_section_is_refused_naming_the_file(tmp_path: Path, section: dict, message: str):
    raw = {**yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8")), "dagster": section}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(PipelineSpecError) as info:
        load_pipeline_spec(path)
    assert str(info.value).startswith(f"{path}: invalid pipeline spec: ")
    assert message in str(info.value)


def test_every_asset_has_its_pool_and_one_run_per_partition_backfills():
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    assert set(POOLS) == set(ASSETS)
    assert set(POOLS.values()) == {
        "ragpipe_stage_files",
        "ragpipe_embedding_cache",
        "ragpipe_tantivy",
        "ragpipe_lancedb",
        "ragpipe_bundle_store",
    }
    for name in ASSETS:
        node = graph.get(AssetKey(name))
        assert node.pools == {POOLS[name]}, name
        assert node.backfill_policy == BackfillPolicy.multi_run(1), name
    assert defs.resolve_job_def("build_revision").executor_def.name == "in_process"
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"


def test_loading_the_definitions_prints_no_dagster_preview_or_beta_warning():
    code = (
        "from ragpipe.defs import build_definitions\n"
        "d = build_definitions()\n"
        "d.resolve_job_def('build_revision'); d.resolve_implicit_global_asset_job_def(); d.resolve_asset_graph()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "PreviewWarning" not in proc.stderr and "BetaWarning" not in proc.stderr, proc.stderr
