# One-command set-up: `make test` and `make demo` create everything they need on a fresh
# Debian 12 machine (virtualenv, pinned packages, Debian server packages, Kafka jars) and
# skip every step that is already done.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-nodeps.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install venv native servers lint test test-unit test-integration demo services-up services-down clean

install: venv native servers

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

lint: venv
	$(VENV)/bin/ruff check .

test: install lint
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest -m integration

# The demo starts servers of its own (.demo/services, other ports): `make test` never touches them.
demo: install
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/demo

services-up:
	@$(PYTHON) scripts/services up

services-down:
	@$(PYTHON) scripts/services down

clean: services-down
	rm -rf .services .state
	@if [ -f .demo/env ]; then . .demo/env && $(PYTHON) scripts/services down; fi
	rm -rf .demo
