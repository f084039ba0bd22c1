# One-command set-up: `make test` and `make demo` create everything they need on a fresh
# Debian 12 machine (virtualenv, pinned packages, Debian server packages, Kafka jars) and
# skip every step that is already done.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-nodeps.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install venv native servers compat-build lint test test-unit test-integration compat campaign demo services-up services-down clean

install: venv native servers compat-build

venv: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@rm -f $(VENV)/.installed-* && touch $@

# The compiled hot path (include/tidegate/native, docs/architecture.md): rebuilt when its
# sources change; without it tidegate runs the pure-Python path.
native: venv
	$(PY) scripts/build_native.py

servers:
	@$(PYTHON) scripts/services install

# Debezium's own connectors for the comparison harness (tests/compat, docs/compat.md): Maven
# fetches them from Central here, at install time (cached in ~/.m2), never during the tests.
# Two builds, because the MariaDB connector stops at 3.5.0.Final on Central.
COMPAT_DIR := tests/compat/debezium-capture
COMPAT_STAMP := $(COMPAT_DIR)/target/.built-$(shell cat $(COMPAT_DIR)/pom.xml $(COMPAT_DIR)/src/main/java/tidegate/compat/*.java | sha1sum | cut -c1-12)

compat-build: $(COMPAT_STAMP)

$(COMPAT_STAMP): $(COMPAT_DIR)/pom.xml $(wildcard $(COMPAT_DIR)/src/main/java/tidegate/compat/*.java)
	@command -v mvn >/dev/null && command -v java >/dev/null || { \
	  echo "installing Maven and a JDK (Debian packages maven, openjdk-17-jdk-headless)"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq maven openjdk-17-jdk-headless >/dev/null; }
	cd $(COMPAT_DIR) && mvn -q -B -Dstyle.color=never -Ppostgres package && mvn -q -B -Dstyle.color=never -Pmariadb package
	@rm -f $(COMPAT_DIR)/target/.built-* && touch $@

lint: venv
	$(VENV)/bin/ruff check .

# Two workers, a test module at a time each; the second runs on servers of its own (lane 1 of
# scripts/services, tests/conftest.py). TEST_WORKERS=0: one process, as before.
TEST_WORKERS ?= 2
test: install lint
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest -m integration

# tidegate's envelope: debezium against Debezium's own connectors (docs/compat.md); also part of `make test`.
# `make compat SEEDS=100` compares generated backlogs of seeds 1..100 (FIRST=101: from 101 on; the
# fixed backlog and CI's seeds are compared without SEEDS); SEED=7 compares one seed.
compat: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 \
	  $(if $(or $(SEEDS),$(SEED)),TIDEGATE_COMPAT_SEEDS=$(or $(SEED),$$(seq -s, $(or $(FIRST),1) $$(( $(or $(FIRST),1) + $(or $(SEEDS),1) - 1 ))))) \
	  $(PY) -m pytest $(if $(or $(SEEDS),$(SEED)),tests/compat/test_generated.py -s -o addopts=-ra,tests/compat)

# The seeded fault campaign (tests/campaign/runner.py): `make campaign SEEDS=20`, `make campaign SEED=7`
# (reproduces one seed), FIRST=100 (first seed), SOURCES=mysql,postgres SINKS=kafka,nats,redis,delta
# KINDS=run_kill,zombie,... (subsets), DELIVERY=executor (runs delivered by a Spark task), HANGS=past_timeouts
# (store and source timeouts of 3 s, hangs of those servers past them), SNAPSHOTS=resnapshot (one faulted
# run per schedule re-loads tables), FAILOVERS=gtid (MariaDB: the connection moves between the GTID primary
# and its replica after some steps' faults), REWINDS=random (an operator rewinds a message sink, under a run
# or after it; REWINDS=any: any sink, Delta's included), RETRIES=same_record (a faulted run that failed is
# delivered again from its record, as an Airflow retry of its deliver task, before the reruns), POISON=dlq
# (rows too large for Kafka and NATS, which dead-letter them; dlq_mixed: half of them past 16 MiB too),
# ENVELOPE=debezium (the Kafka sink writes Debezium's records, with tombstones and transaction metadata),
# KAFKA=idempotent (the Kafka sink's idempotent producer, judged at least once), TYPES=edges (a column of
# every type the source offers, values at the edges of their types), PLUGIN=pgoutput (PostgreSQL's slot
# plugin; default wal2json), KEEP=DIR (work in DIR and keep the runs' logs, to diagnose a failed seed);
# prints each seed's schedule and verdict, then the figure table.
campaign: venv native servers
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 $(PY) -m tests.campaign.runner \
	  $(if $(SEED),--seed $(SEED),--seeds $(or $(SEEDS),10)) $(if $(FIRST),--first $(FIRST)) \
	  $(if $(SOURCES),--sources $(SOURCES)) $(if $(SINKS),--sinks $(SINKS)) $(if $(KINDS),--kinds $(KINDS)) \
	  $(if $(DELIVERY),--delivery $(DELIVERY)) $(if $(HANGS),--hangs $(HANGS)) \
	  $(if $(SNAPSHOTS),--snapshots $(SNAPSHOTS)) $(if $(FAILOVERS),--failovers $(FAILOVERS)) \
	  $(if $(REWINDS),--rewinds $(REWINDS)) $(if $(RETRIES),--retries $(RETRIES)) \
	  $(if $(POISON),--poison $(POISON)) $(if $(ENVELOPE),--envelope $(ENVELOPE)) \
	  $(if $(KAFKA),--kafka $(KAFKA)) $(if $(TYPES),--types $(TYPES)) \
	  $(if $(PLUGIN),--plugin $(PLUGIN)) $(if $(KEEP),--keep $(KEEP))

# The demo starts servers of its own (.demo/services, other ports): `make test` never touches them.
demo: install
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/demo

services-up:
	@$(PYTHON) scripts/services up

services-down:
	@$(PYTHON) scripts/services down
	@TIDEGATE_LANE=1 $(PYTHON) scripts/services down

clean: services-down
	rm -rf .services .services-lane* .state
	@if [ -f .demo/env ]; then . .demo/env && $(PYTHON) scripts/services down; fi
	rm -rf .demo
