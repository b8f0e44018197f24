# ragpipe developer entry points. Everything runs inside .venv; runtime state goes to var/.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export RAGPIPE_HOME ?= $(CURDIR)/var/ragpipe
export DAGSTER_HOME ?= $(CURDIR)/var/dagster
# Two cores: keep torch and BLAS thread pools from oversubscribing them.
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE := 1

.PHONY: install demo serve-demo test test-slow lint ui ui-check bench query-bench clean dagster-home redis celery-worker pools

install: $(VENV)/.installed

# CPU torch first, from the pinned release (a plain `torch` requirement would pull a CUDA build).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Install the instance template, overwriting a stale copy (new pool settings must reach it).
dagster-home:
	cmp -s dagster.yaml $(DAGSTER_HOME)/dagster.yaml || install -D -m 644 dagster.yaml $(DAGSTER_HOME)/dagster.yaml

# The demo walks the whole chain: revision 1 is built, evaluated and gated without an incumbent
# (bootstrap) and activated on staging; revision 2, which repairs 24 abstracts revision 1 holds
# truncated, is gated against it as a refresh (only the corpus changed: it must not be worse) and
# activated if eligible; revision 3 only adds documents, and the suite grows with it (2 cases judge
# documents only revision 3 has: new coverage), so it is gated as a refresh against revision 2 and
# goes live; then staging is rolled back to revision 2 (as after an incident: no rebuild), the
# release table and the pointer are shown, and queries are served by the active release.
# `release_of` reads a revision's release ID from its (up-to-date, so instant) build.
release_of = $$($(BIN)/ragpipe build data/scifact-sample/rev-$(1).jsonl --revision scifact-$(1) --default-scope public --json | $(BIN)/python -c 'import json,sys; print(json.load(sys.stdin)["release_id"])')

demo: install dagster-home
	$(BIN)/ragpipe build data/scifact-sample/rev-1.jsonl --revision scifact-1 --default-scope public
	$(BIN)/ragpipe release activate --revision scifact-1 --target staging
	$(BIN)/ragpipe build data/scifact-sample/rev-2.jsonl --revision scifact-2 --default-scope public
	$(BIN)/ragpipe eval --suite data/scifact-sample/suite-stable.jsonl --revision scifact-1 --out var/demo-eval/scifact-1-$$(date +%s)
	$(BIN)/ragpipe eval --suite data/scifact-sample/suite-stable.jsonl --revision scifact-2 --out var/demo-eval/scifact-2-$$(date +%s)
	$(BIN)/ragpipe release activate --revision scifact-2 --target staging || echo "revision 2 was not activated: the error above names the gate's decisive phase"
	$(BIN)/ragpipe build data/scifact-sample/rev-3.jsonl --revision scifact-3 --default-scope public
	$(BIN)/ragpipe release activate --revision scifact-3 --target staging || echo "revision 3 was not activated: the error above says why"
	$(BIN)/ragpipe release rollback --target staging || echo "nothing was rolled back: see the error above"
	$(BIN)/ragpipe release list
	$(BIN)/ragpipe release current --target staging
	$(BIN)/ragpipe query "Aspirin reduces the risk of cardiovascular events" --k 3
	$(BIN)/ragpipe query "ALDH1 expression and breast cancer outcome" --revision scifact-2 --k 3 --mode lexical
	$(BIN)/ragpipe query "vitamin D deficiency and tuberculosis" --revision scifact-2 --k 3 --mode vector
	$(BIN)/ragpipe answer "Does aspirin reduce the risk of cardiovascular events?"
	$(MAKE) --no-print-directory serve-demo

# The HTTP service on the active release of staging (revision 2 after the demo's rollback): query
# it with curl, then activate revision 3 and roll back while it runs, showing /v1/release follow
# each step; the server stops at the end.
DEMO_PORT ?= 8089
serving = until curl -sf localhost:$(DEMO_PORT)/v1/release | grep -q "$(1)"; do sleep 0.2; done; curl -s localhost:$(DEMO_PORT)/v1/release; echo
serve-demo: install
	@set -e; mkdir -p var; \
	$(BIN)/ragpipe serve --port $(DEMO_PORT) --config deploy/serve-local.yaml 2> var/serve-demo.log & pid=$$!; \
	trap "kill $$pid" EXIT; \
	rel2=$(call release_of,2); rel3=$(call release_of,3); \
	$(call serving,$$rel2); \
	curl -s localhost:$(DEMO_PORT)/v1/query -d '{"query": "Aspirin reduces the risk of cardiovascular events", "k": 2}' \
	  | $(BIN)/python -c 'import json,sys; d=json.load(sys.stdin); print(d["release_id"], [(h["rank"], h["document_id"], h["title"][:60]) for h in d["hits"]])'; \
	$(BIN)/ragpipe release activate $$rel3 --target staging || echo "revision 3 was not activated"; \
	$(call serving,$$rel3); \
	$(BIN)/ragpipe release rollback --target staging; \
	$(call serving,$$rel2)

# The BEIR SciFact folder (corpus.jsonl.gz, queries.jsonl, qrels/) the benchmarks read lives outside
# the repository, so it has no default: `make bench SCIFACT=PATH/TO/scifact` (docs/benchmarks.md, "Data").
need_scifact = $(if $(SCIFACT),,$(error make $@ needs SCIFACT=PATH/TO/scifact: the BEIR SciFact folder (docs/benchmarks.md "Data")))

query-bench: install
	$(need_scifact)
	$(BIN)/python -m benchmarks.query_bench --scifact "$(SCIFACT)" --bundle "$$(ls -d var/bench/cold/ragpipe/bundles/[0-9a-f]* | head -1)"

# The end-to-end stacks (Celery workers with PostgreSQL, Redis and S3, marked slow) take 21 minutes
# of a 90-minute suite on a 2-core host without AVX-512: they run in `make test-slow`, not in CI.
test: install
	$(BIN)/python -m pytest -m "not slow"

test-slow: install
	$(BIN)/python -m pytest -m slow

# The formatter and the linter (rule set in pyproject.toml); CI runs this before the tests.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# Run from $DAGSTER_HOME: `dagster dev` warns when the folder it starts in holds a dagster.yaml
# other than $DAGSTER_HOME's (workspace.yaml's paths are relative to itself, so any folder works).
ui: install dagster-home
	cd $(DAGSTER_HOME) && $(CURDIR)/$(BIN)/dagster dev -w $(CURDIR)/workspace.yaml

# Starts the webserver on 127.0.0.1 (temporary homes) and checks the graph it serves through GraphQL.
ui-check: install dagster-home
	$(BIN)/python -m pytest -q ragpipe_tests/defs/test_ui_graphql.py

# Redis on 127.0.0.1 for the Celery executor (broker db 0, results db 1), in the foreground, nothing
# persisted; and one Celery worker for ragpipe's steps (docs/operations.md, "Celery workers").
REDIS_PORT ?= 6379
redis:
	redis-server --port $(REDIS_PORT) --bind 127.0.0.1 --save '' --appendonly no --daemonize no

WORKER ?= worker-1
celery-worker: install
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dagster-celery worker start -A dagster_celery.app -y deploy/celery-worker.yaml \
	  -n $(WORKER) -q dagster -- --concurrency=1

# Each pool's limit set explicitly on the instance $DAGSTER_HOME names (run once per PostgreSQL
# instance): Dagster's first-use initialisation of a default limit races between processes on
# PostgreSQL (docs/operations.md, "Celery workers").
POOLS = ragpipe_stage_files ragpipe_embedding_cache ragpipe_tantivy ragpipe_lancedb ragpipe_bundle_store ragpipe_evaluation ragpipe_release_store
SHARD_POOL = ragpipe_embedding_shards
SHARD_SLOTS ?= 2
pools: install
	for pool in $(POOLS); do $(BIN)/dagster instance concurrency set $$pool 1 || exit 1; done
	$(BIN)/dagster instance concurrency set $(SHARD_POOL) $(SHARD_SLOTS)

bench: install
	$(need_scifact)
	$(BIN)/python -m benchmarks.build_bench --scifact "$(SCIFACT)"

clean:
	rm -rf var
