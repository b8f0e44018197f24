"""The GraphQL texts ragpipe sends to ``dagster-webserver`` (re-exported by ``ragpipe_tests.support.services``).

Each is validated against the installed dagster-graphql schema by
``ragpipe_tests/orchestration/test_postgres_instance.py::test_graphql_texts_are_valid_for_the_installed_dagster_graphql``.
Field notes: an asset's code version is ``opVersion``; a team owner comes back without its ``team:``
prefix; ``Repository.jobs`` includes ``__ASSET_JOB``.
"""

ASSET_GRAPH_QUERY = """
query RagpipeAssetGraph($group: AssetGroupSelector!) {
  assetNodes(group: $group) {
    assetKey { path } description opVersion groupName kinds pools isPartitioned
    owners { __typename ... on UserAssetOwner { email } ... on TeamAssetOwner { team } }
    tags { key value } backfillPolicy { policyType maxPartitionsPerRun } dependencyKeys { path }
    assetChecksOrError { __typename ... on AssetChecks { checks { name description blocking additionalAssetKeys { path } } } }
  }
}
"""

REPOSITORY_QUERY = """
query RagpipeRepository($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository { name location { name }
      jobs { name description isAssetJob }
      sensors { name description sensorType minIntervalSeconds defaultStatus targets { pipelineName } }
      schedules { name description cronSchedule pipelineName } }
    ... on RepositoryNotFoundError { message }
    ... on PythonError { message }
  }
}
"""

INSTANCE_QUERY = """
query RagpipeInstance { instance { supportsConcurrencyLimits
  poolConfig { poolGranularity defaultPoolLimit opGranularityRunBuffer }
  concurrencyLimits { concurrencyKey slotCount }
  daemonHealth { allDaemonStatuses { daemonType healthy required } } } }
"""

LOCATION_QUERY = """
query RagpipeLocation($name: String!) { workspaceLocationEntryOrError(name: $name) { __typename
  ... on WorkspaceLocationEntry { name loadStatus locationOrLoadError { __typename ... on PythonError { message } } }
  ... on PythonError { message } } }
"""

JOB_RUNS_QUERY = """
query RagpipeJobRuns($selector: PipelineSelector!) { pipelineOrError(params: $selector) { __typename
  ... on Pipeline { name description pipelineSnapshotId runs(limit: 20) { runId status pipelineSnapshotId tags { key value } } }
  ... on PipelineNotFoundError { message } ... on PythonError { message } } }
"""

BACKFILL_MUTATION = """
mutation RagpipeBackfill($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) { __typename
  ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message stack }
  ... on PartitionKeysNotFoundError { message } ... on InvalidSubsetError { message } ... on UnauthorizedError { message } } }
"""

BACKFILL_STATUS_QUERY = """
query RagpipeBackfillStatus($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { id status isAssetBackfill numPartitions runs { runId status jobName startTime endTime tags { key value } } }
  ... on BackfillNotFoundError { message } ... on PythonError { message } } }
"""

ADD_PARTITION_MUTATION = """
mutation RagpipeAddPartition($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name, partitionKey: $key) { __typename
    ... on AddDynamicPartitionSuccess { partitionKey } ... on DuplicateDynamicPartitionError { partitionName }
    ... on PythonError { message } ... on UnauthorizedError { message } } }
"""

QUERIES = {
    "ASSET_GRAPH_QUERY": ASSET_GRAPH_QUERY,
    "REPOSITORY_QUERY": REPOSITORY_QUERY,
    "INSTANCE_QUERY": INSTANCE_QUERY,
    "LOCATION_QUERY": LOCATION_QUERY,
    "JOB_RUNS_QUERY": JOB_RUNS_QUERY,
    "BACKFILL_MUTATION": BACKFILL_MUTATION,
    "BACKFILL_STATUS_QUERY": BACKFILL_STATUS_QUERY,
    "ADD_PARTITION_MUTATION": ADD_PARTITION_MUTATION,
}
