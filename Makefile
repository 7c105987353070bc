# The README's two commands are `make quickstart` and `make test`.
SHELL := /bin/bash
export ZJUSCT_CACHE ?= /var/cache/zjusct-cloud
VENV := $(ZJUSCT_CACHE)/venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup quickstart test lint sanity unit docs-check clean

setup: ## install Debian packages, the Python venv and link the collection
	hack/install-deps.sh

quickstart: ## bring this host up (site.yml), start alice's VM, list it, run a command inside it
	hack/quickstart.sh

test: ## everything: setup, lint, sanity, unit, integration and e2e tests and the Molecule scenarios, against real components
	hack/test.sh

unit: setup ## unit tests only (no real components)
	pytest -p no:cacheprovider tests/unit

lint: setup
	ruff check plugins launcher tests bench controller extensions localcluster
	ansible-lint --profile production --offline

sanity: setup
	hack/sanity.sh

clean:
	rm -rf .collections .pytest_cache .mypy_cache .ruff_cache
