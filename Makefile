# The README's three commands are `make quickstart`, `make quickstart-kubernetes` and `make test`.
SHELL := /bin/bash
export ZJUSCT_CACHE ?= /var/cache/zjusct-cloud
VENV := $(ZJUSCT_CACHE)/venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup quickstart quickstart-kubernetes test lint sanity unit docs-check clean

setup: ## install Debian packages, the Python venv and link the collection
	hack/install-deps.sh

quickstart: ## bring this host up (site.yml), start alice's VM, list it, run a command inside it
	hack/quickstart.sh

quickstart-kubernetes: ## the Kubernetes backend on this machine: a local cluster of 2 nodes + Ceph, site.yml, alice's VM on RBD
	hack/quickstart-kubernetes.sh

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
