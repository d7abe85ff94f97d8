# edgetune: every target sets up what it needs (venv, Docker engine, twin
# images) and reuses what a previous run left.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
VENV38  := .venv38
BIN     := $(CURDIR)/$(VENV)/bin
FLEET   ?= orin-nx-16gb-r36:1,agx-orin-64gb-r35:1,rock5b-rk3588:1
# Molecule scenarios `make test` runs: every molecule/*/molecule.yml. The VM twin's
# scenario (molecule/vm-orin-nx) is not among them yet: its molecule.yml.wip does not pass.
SCENARIOS ?= $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml)))
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv venv38 engine images vm-image lint unit unit38 molecule integration test demo twins-down artifacts bench

help:
	@echo "make demo   provision a twin fleet with site.yml (orin-fleet, then rk3588-fleet)"
	@echo "make test   lint, unit tests (Python 3.11 and 3.8), integration and molecule on twins"
	@echo "make bench  benchmarks (runtime P99 under noise, audit vs --check, eBPF priority)"
	@echo "make twins-down   remove the demo twins"

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt tools/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -e tools
	touch $@

# Python 3.8 (JetPack 5's Python) for the modules' unit tests.
venv38: $(VENV38)/.installed
$(VENV38)/.installed: requirements-py38.txt | venv
	tools/python38 -m venv $(VENV38)
	$(VENV38)/bin/pip install -q --disable-pip-version-check -r requirements-py38.txt
	touch $@

engine: venv
	edgetune twin engine

images: venv
	edgetune twin images

# The VM twin's disk (cached in .cache/vm/): root, loop devices, qemu-system-x86, extlinux.
vm-image: venv
	edgetune vm build

lint: venv
	yamllint --strict .
	ansible-lint -q
	ruff check .
	pytest -q tests/static

unit: venv
	pytest -q tests/unit

unit38: venv38
	tools/run-unit-py38 $(VENV38) $(VENV)

integration: venv
	if [ "$$(id -u)" -eq 0 ]; then tools/setup-netqos-host; fi
	pytest -q tests/integration

molecule: images artifacts
	for scenario in $(SCENARIOS); do molecule test -s $$scenario; done

test: lint unit unit38 integration molecule

demo: images artifacts
	tools/demo "$(FLEET)"

twins-down: venv
	edgetune twin down

# The reference runtime and engine packaged with their manifests (.cache/artifacts/).
artifacts: venv
	tools/package-runtime

# Benchmarks: ratios measured side by side in one run; not tests.
bench: images artifacts
	tools/bench-runtime
	tools/bench-audit
	/usr/bin/python3 tools/edgetune/bench_netqos.py
