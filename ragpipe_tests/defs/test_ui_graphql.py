"""The UI, checked through the webserver's GraphQL API (also ``make ui-check``).

``dagster-webserver`` runs on 127.0.0.1 with the repository's ``workspace.yaml`` and an instance
made from ``dagster.yaml``; everything it serves must equal ``build_definitions()``: assets,
checks, jobs, sensors and schedules with their descriptions, code versions, pools, backfill policy,
owners and tags, and the instance's pool settings.
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from dagster import AssetKey

from ragpipe.defs import build_definitions
from ragpipe.defs.assets import GROUP, POOLS
from ragpipe.spec import load_pipeline_spec
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.services import (
    ASSET_GRAPH_QUERY,
    INSTANCE_QUERY,
    LOCATION,
    REPOSITORY,
    REPOSITORY_QUERY,
    graphql,
    repository_selector,
    start_webserver,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The webserver; it serves the same code location as ``dagster dev`` and ``ragpipe build``."""
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    server = start_webserver(home, {"RAGPIPE_HOME": str(root / "ragpipe")})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ui(server) -> str:
    return server.url


@pytest.fixture(scope="module")
def defs():
    return build_definitions()


@pytest.fixture(scope="module")
def nodes(ui, defs) -> dict[str, dict]:
    """Every served asset node, from each asset group the definitions have."""
    groups = {node.group_name for node in defs.resolve_asset_graph().asset_nodes}
    found = {}
    for group in sorted(groups):
        selector = {"groupName": group, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
        found.update({"/".join(n["assetKey"]["path"]): n for n in graph_nodes(ui, selector)})
    return found


def graph_nodes(url: str, group: dict[str, str]) -> list[dict]:
    return graphql(url, ASSET_GRAPH_QUERY, {"group": group})["assetNodes"]


def test_every_asset_is_served_with_description_code_version_pool_and_policy(nodes, defs):
    graph = defs.resolve_asset_graph()
    assert set(nodes) == {k.to_user_string() for k in graph.get_all_asset_keys()}
    for name, node in nodes.items():
        asset = graph.get(AssetKey(name))
        assert node["description"] and node["description"] == asset.description, name
        assert node["opVersion"] == asset.code_version, name
        assert node["groupName"] == asset.group_name, name
        assert node["isPartitioned"] == (asset.partitions_def is not None), name
        assert node["pools"] == sorted(asset.pools), name
        policy = asset.backfill_policy
        assert node["backfillPolicy"] == (
            policy and {"policyType": policy.policy_type.value, "maxPartitionsPerRun": policy.max_partitions_per_run}
        ), name
        assert sorted(node["kinds"]) == sorted(asset.kinds), name
        assert sorted("/".join(d["path"]) for d in node["dependencyKeys"]) == sorted(
            k.to_user_string() for k in asset.parent_keys
        ), name


def test_build_assets_have_spec_code_versions_pools_and_one_run_per_revision(nodes):
    spec = load_pipeline_spec()
    build = {name: node for name, node in nodes.items() if node["groupName"] == GROUP}
    assert set(build) == set(POOLS)
    for name, node in build.items():
        assert node["opVersion"] == spec.spec_ids[name], name
        assert node["isPartitioned"] is True, name
        assert node["pools"] == [POOLS[name]], name
        assert node["backfillPolicy"] == {"policyType": "MULTI_RUN", "maxPartitionsPerRun": 1}, name


def test_owners_and_tags_are_the_spec_dagster_section(nodes):
    spec = load_pipeline_spec()
    for name in POOLS:
        node = nodes[name]
        # A team owner comes back without its "team:" prefix.
        owners = [f"team:{o['team']}" if o["__typename"] == "TeamAssetOwner" else o["email"] for o in node["owners"]]
        assert owners == spec.dagster.owners_for(name), name
        tags = {t["key"]: t["value"] for t in node["tags"] if not t["key"].startswith("dagster/")}
        assert tags == spec.dagster.tags_for(name), name


def test_every_check_is_served_with_its_description(nodes, defs):
    expected = {
        (key.asset_key.to_user_string(), key.name): spec
        for checks in defs.asset_checks or []
        for key, spec in ((s.key, s) for s in checks.check_specs)
    }
    served = {(name, c["name"]): c for name, node in nodes.items() for c in node["assetChecksOrError"]["checks"]}
    assert set(served) == set(expected)
    assert {("chunks", "chunks_match_source"), ("index_bundle", "bundle_verifies")} <= set(served)
    for key, check in served.items():
        assert check["description"] and check["description"] == expected[key].description, key
        assert check["blocking"] is True, key
        assert [k["path"] for k in check["additionalAssetKeys"]] == [
            list(k.asset_key.path) for k in expected[key].additional_deps
        ], key


def test_jobs_sensors_and_schedules_are_served_with_descriptions(ui, defs):
    repo = graphql(ui, REPOSITORY_QUERY, {"selector": repository_selector()})["repositoryOrError"]
    assert repo["__typename"] == "Repository" and repo["location"] == {"name": LOCATION}
    jobs = {j["name"]: j for j in repo["jobs"] if not j["name"].startswith("__")}
    assert set(jobs) == {j.name for j in defs.jobs or []} and "build_revision" in jobs
    for name, job in jobs.items():
        assert job["description"] and job["description"] == defs.resolve_job_def(name).description, name
        assert job["isAssetJob"] is (name != "activate_release"), name  # activate_release is an op job
    sensors = {s["name"]: s for s in repo["sensors"]}
    assert set(sensors) == {s.name for s in defs.sensors or []} and "corpus_revision_sensor" in sensors
    for name, sensor in sensors.items():
        definition = defs.resolve_sensor_def(name)
        assert sensor["description"] and sensor["description"] == definition.description, name
        assert sensor["minIntervalSeconds"] == definition.minimum_interval_seconds, name
        assert sensor["defaultStatus"] == definition.default_status.value, name
    revisions = sensors["corpus_revision_sensor"]
    assert (revisions["minIntervalSeconds"], revisions["defaultStatus"]) == (30, "STOPPED")
    assert [t["pipelineName"] for t in revisions["targets"]] == ["build_revision"]
    schedules = {s["name"]: s for s in repo["schedules"]}
    assert set(schedules) == {s.name for s in defs.schedules or []}
    for name, schedule in schedules.items():
        assert schedule["description"] and schedule["description"] == defs.resolve_schedule_def(name).description, name


def test_the_instance_limits_every_pool_to_one_slot_per_step(ui):
    instance = graphql(ui, INSTANCE_QUERY)["instance"]
    assert instance["supportsConcurrencyLimits"] is True
    assert instance["poolConfig"] == {"poolGranularity": "op", "defaultPoolLimit": 1, "opGranularityRunBuffer": 1}


def test_the_top_level_instance_is_what_make_dagster_home_installs_and_make_ui_uses():
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "install -D -m 644 dagster.yaml $(DAGSTER_HOME)/dagster.yaml" in text
    # `dagster dev` started in the repository would warn that ./dagster.yaml is ignored
    assert "cd $(DAGSTER_HOME) && $(CURDIR)/$(BIN)/dagster dev -w $(CURDIR)/workspace.yaml" in text
    config = yaml.safe_load((REPO / "dagster.yaml").read_text(encoding="utf-8"))
    assert config["nux"] == {"enabled": False} and config["telemetry"] == {"enabled": False}
    assert sorted(p.name for p in (REPO / "deploy").iterdir()) == [
        "celery-worker.yaml",
        "dagster-celery.yaml",
        "dagster-k8s.yaml",
        "dagster-postgres.yaml",
        "serve-local.yaml",
    ]


def test_loading_the_location_prints_no_warning(server, nodes):
    # The webserver's log also holds its code server's output: no Dagster Preview/Beta/Deprecation
    # warning is printed when the location loads.
    log = server.log_path.read_text(errors="replace")
    assert "Warning" not in log, log
