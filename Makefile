# Fleet's developer entry points. Every target bootstraps its own environment: on a fresh machine
# with only python3 (>= 3.11) and make, `make test` and `make dev` work from a clean clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed
PACKAGES := contract fleet-core fleet-serving

.PHONY: console help dev seed smoke kube test check lint format typecheck compat bench lock notice llama-server engine-image e2e image image-base image-test clean web web-dev web-check

help:
	@echo "make dev    - run the system on embedded defaults"
	@echo "make web    - build the operator console (npm ci + vite build) into fleet-core's package data"
	@echo "make web-dev - the console's vite dev server on :5173, proxying to make dev's gateway and control plane"
	@echo "make seed   - create a demo tenant, project, key and budget rule (with make dev running)"
	@echo "make smoke  - prove the running system works end to end (with make dev running)"
	@echo "make test   - run every test (the CI command)"
	@echo "make kube   - build the real Kubernetes control plane the tests use (once, cached)"
	@echo "make check  - format, lint, import layering, strict types, contract compatibility, console types"
	@echo "make bench  - run the benchmarks and write docs/benchmarks.md"
	@echo "make lock   - re-resolve dependencies and rewrite requirements.lock (and NOTICE)"
	@echo "make notice - regenerate NOTICE from the locks (a test fails when it is stale)"
	@echo "make llama-server - build llama.cpp's llama-server once into ~/.cache/fleet"
	@echo "make engine-image - llama-server as a non-root image archive for a test node (build/)"
	@echo "make e2e    - the tests against a real engine (llama-server on Gemma 3 270M)"
	@echo "make image  - the fleet-core and fleet-serving images for IMAGE_ARCHES into build/ (OCI archives)"
	@echo "make image-base - a local Debian base image per arch (mmdebstrap), for IMAGE_BASE=..."
	@echo "make image-test - run both images from the archives as Kubernetes would (podman; qemu)"

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# requirements.lock pins every third-party package with hashes; the three workspace packages are
# installed editable on top, without dependencies, so nothing unpinned slips in.
$(STAMP): $(BIN)/uv requirements.lock $(addsuffix /pyproject.toml,$(PACKAGES))
	$(BIN)/uv pip install --quiet --python $(PY) --require-hashes -r requirements.lock
	$(BIN)/uv pip install --quiet --python $(PY) --no-deps --no-build-isolation \
		$(addprefix -e ./,$(PACKAGES))
	touch $(STAMP)

# The operator console (web/, ADR 0012): npm ci when the lock changed, vite build when a source
# changed, into fleet-core's package data (gitignored) where the gateway serves it at /.
# npm keeps downloaded packages in its own cache (~/.npm), so a fresh clone's npm ci is quick.
WEB_OUT := fleet-core/src/fleet_core/gateway/console/static/index.html
WEB_DEPS := web/node_modules/.package-lock.json
WEB_SRC := $(shell find web/src web/index.html web/vite.config.ts web/tsconfig.json web/package.json -type f 2>/dev/null)

$(WEB_DEPS): web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error
	touch $(WEB_DEPS)

$(WEB_OUT): $(WEB_DEPS) $(WEB_SRC)
	cd web && npx --no-install vite build --logLevel warn

web:
	rm -f $(WEB_OUT)
	$(MAKE) $(WEB_OUT)

web-dev: $(WEB_DEPS)
	cd web && npx --no-install vite

# tsc --noEmit and the console's unit tests (vitest).
web-check: $(WEB_DEPS)
	cd web && npx --no-install tsc --noEmit
	cd web && npx --no-install vitest run

# make dev builds the console when it is missing or stale; without npm it serves a placeholder page.
console:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(WEB_OUT); \
	else echo "make dev: npm not found, the console at / is a placeholder (install Node.js 20+)"; fi

# REAL=1: the model registry pulls from the Hugging Face hub instead of the synthetic one.
dev: $(STAMP) console
	REAL=$(REAL) $(PY) -m fleet_core.devtools.devrun

# Needs `make dev` running (or FLEET_SEED_API pointing at a control plane).
seed: $(STAMP)
	$(PY) -m fleet_core.devtools.seed

# Needs `make dev` running: every check against its gateway and control plane, with the admin
# token it keeps in .dev/; the auth, rate-limit and metrics rows run on a second gateway of the
# smoke command's own (docs/smoke.md). FLEET_DEV_PORT / FLEET_DEV_API_PORT move it as they move
# make dev; SMOKE_ARGS adds options (e.g. SMOKE_ARGS=--keep-going).
SMOKE_ADMIN_TOKEN ?= .dev/admin-token
smoke: $(STAMP)
	$(BIN)/fleet smoke --gateway http://127.0.0.1:$${FLEET_DEV_PORT:-8080} \
		--control-plane http://127.0.0.1:$${FLEET_DEV_API_PORT:-8081} \
		--admin-token-file $(SMOKE_ADMIN_TOKEN) --own-gateway \
		--hub http://127.0.0.1:$${FLEET_DEV_HUB_PORT:-8090} $(SMOKE_ARGS)

# The operator's tests run on a real etcd + kube-apiserver + kube-controller-manager, built once
# from the Kubernetes Go modules into ~/.cache/fleet/k8s-<version>/ (needs Go; instant when cached).
kube: $(STAMP)
	PYTHONPATH=e2e $(PY) -m fleet_testing.kube_build

# The console is built first: its browser tests (e2e/tests/test_console_browser.py) drive it.
test: $(STAMP) kube $(WEB_OUT)
	$(BIN)/pytest

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy contract/src fleet-core/src fleet-serving/src tools deploy/image/lockpick.py \
		e2e/fleet_testing bench

compat: $(STAMP)
	$(PY) -m fleet_contract.compat

# Every static check CI runs before the tests (.ci/run); `make test` runs the tests.
check: lint typecheck compat web-check

# bench/ at the root is the benchmarks' package; they start servers through e2e/fleet_testing.
bench: $(STAMP)
	PYTHONPATH=.:e2e $(PY) -m bench

# Needs the network: resolves the workspace afresh. uv.lock is a by-product and stays out of git.
lock: $(BIN)/uv
	$(BIN)/uv lock --upgrade
	$(BIN)/uv export --format requirements-txt --no-emit-workspace --all-packages --group dev \
		--no-header --quiet -o requirements.lock
	$(MAKE) notice

# NOTICE lists every pinned third-party package with the license its installed metadata declares.
notice: $(STAMP)
	$(PY) tools/notice.py

# llama.cpp's own server, built from the source vendored in the pinned llama-cpp-python sdist,
# once per version into ${XDG_CACHE_HOME:-~/.cache}/fleet/llama.cpp-<version>/ (~7 min on 2 cores).
llama-server:
	PYTHON=$(PYTHON) e2e/engine/build-llama-server.sh

# Tests marked e2e (pyproject's addopts leave them out of `make test` and plain pytest): a real
# llama-server on a real GGUF, built and fetched into the per-user cache first (both steps return
# at once when cached), and the whole system from `kubectl apply` on the real Kubernetes control
# plane (make kube) on a real node (kubelet + containerd) running the engine image (make
# engine-image) and Fleet's own images (make image for this machine's architecture, on the local
# base engine-image makes unless IMAGE_BASE names another); it needs root (docs/e2e.md).
e2e: $(STAMP) llama-server kube engine-image
	$(MAKE) image IMAGE_BASE=$(or $(IMAGE_BASE),localhost/fleet-base:bookworm) \
		IMAGE_ARCHES=$(HOST_ARCH)
	PYTHON=$(PYTHON) e2e/engine/fetch-gemma.sh
	$(BIN)/pytest -m e2e

# Images (deploy/image): for each architecture in IMAGE_ARCHES, the foreign one under qemu-user
# (registered with binfmt_misc on demand, which needs root; IMAGE_ARCHES=amd64 builds one alone).
# buildah, or Docker when a daemon answers and one architecture is asked for; IMAGE_BASE=...
# overrides the Dockerfile's base (make image-base builds localhost/fleet-base:bookworm-<arch>
# with mmdebstrap, cached in ~/.cache/fleet). The console is built first (when npm is there) so
# the fleet-core image serves it at /.
IMAGE_ARCHES ?= amd64 arm64
HOST_ARCH := $(shell dpkg --print-architecture 2>/dev/null || uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')

image: console
	IMAGE_BASE=$(IMAGE_BASE) IMAGE_ARCHES="$(IMAGE_ARCHES)" deploy/image/build.sh

image-base:
	IMAGE_ARCHES="$(IMAGE_ARCHES)" deploy/image/build-base.sh

# llama-server (make llama-server) on the local base image, non-root, saved for a test node.
engine-image: $(STAMP)
	PYTHON=$(PYTHON) FLEET_PY=$(PY) e2e/engine/build-engine-image.sh

image-test:
	IMAGE_ARCHES="$(IMAGE_ARCHES)" deploy/image/test.sh

clean:
	rm -rf $(VENV) .dev .pytest_cache .mypy_cache .ruff_cache web/node_modules web/artifacts \
		fleet-core/src/fleet_core/gateway/console/static
