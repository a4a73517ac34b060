# resumequal: `make run` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch the environment qualifies, installed before the project (from PyPI: a CUDA
# build of several GB, which runs on a CPU); within the project's declared range.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# The theme prints an end-of-life notice on every build unless told not to.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

.PHONY: env tools bytecode run test test-serial test-fast lint docs chart images images-build images-smoke images-push bench bench-device gpu-check compat compat-env cluster-build cluster-up cluster-down clean

env: $(VENV)/.installed

# The torch installed first is then a constraint: the project's dependencies that need a
# torch (torchvision, torchdata) are resolved to fit it and never replace it.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
	  >$(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[test,lint,operator,docs]'
	touch $@

# promtool (alert rule checks) and prometheus (the end-to-end alert test) come from
# Debian's prometheus package, kubectl (driven against the tests' API server) from the kubectl
# package; each installed when missing and we may install packages.
tools:
	@command -v promtool >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && \
	    $$SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; }
	@command -v kubectl >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q kubectl >/dev/null || \
	  echo "make tools: kubectl could not be installed; tests/operator/test_kubectl.py needs it"; }

# Our own modules' bytecode, written ahead: the editable install compiles none, and where
# PYTHONDONTWRITEBYTECODE is set (as on these machines) every worker, launcher and comparator
# process would compile them again from source (about 0.2 s of CPU each). Only stale files
# are rewritten: 0.2 s when nothing changed.
bytecode: env
	@$(PY) -m compileall -q -j 0 service operator tests testing >/dev/null

run: env bytecode
	$(VENV)/bin/resumequal run

# The tests marked slow (real torchrun legs, CPU-bound) run one after another; the others,
# and the slow ones that mostly wait (marked waits), run beside them in a second session,
# in the slow tests' idle CPU, their output shown after. Both must pass. The cluster suite
# (tests/cluster, slow) starts the local cluster (testing/cluster) for the session, or uses
# the one `make cluster-up` left running; the operator tests that drive pods (not slow)
# start a cluster of their own beside it (testing/cluster/podcluster.py, build/podcluster-*).
SELECT := not matrix
test: env tools bytecode
	@mkdir -p build
	@$(PY) -m pytest -m '$(SELECT) and (not slow or waits)' $(PYTEST_ARGS) \
	  >build/test-fast.log 2>&1 & \
	fast=$$!; \
	$(PY) -m pytest -m '$(SELECT) and slow and not waits' $(PYTEST_ARGS); slow_rc=$$?; \
	wait $$fast; fast_rc=$$?; \
	echo "==== the tests not marked slow, and those marked waits (run beside the others) ===="; \
	cat build/test-fast.log; \
	echo "make test: slow tests exited $$slow_rc, the others $$fast_rc"; \
	[ $$slow_rc = 0 ] && [ $$fast_rc = 0 ]

test-serial: env tools bytecode
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: env tools bytecode
	$(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

# The tools are held to --strict themselves; our packages they import are checked by the
# first mypy, under the project's settings, so their errors are not reported twice.
# The docs site is part of lint: the generated reference must be current (--check writes
# nothing) and the site must build without a warning.
lint: env
	$(VENV)/bin/ruff check service operator tests testing bench tools
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict --follow-imports=silent tools/dashboard.py tools/grafana_alerts.py \
	  tools/images.py tools/gpu_check.py tools/compat.py tools/spec_docs.py
	$(VENV)/bin/mypy --strict --follow-imports=silent --ignore-missing-imports testing/cluster \
	  testing/ports.py
	$(VENV)/bin/lint-imports
	$(PY) tools/spec_docs.py --check
	$(MKDOCS) build --strict --quiet --site-dir build/site

# The documentation site (mkdocs.yml): the spec reference and the JSON Schemas regenerated
# from the models, then built into build/site.
docs: env
	$(PY) tools/spec_docs.py
	$(MKDOCS) build --strict --site-dir build/site

# The chart as the archive `helm install` and chart repositories take, in CHART_DIR. Helm's
# own engine packages it (helm-python-sdk, as the chart tests render it): no helm binary.
CHART_DIR ?= build/chart
chart: env
	@$(PY) -c 'import helm_python; print(helm_python.package("charts/resumequal", destination="$(CHART_DIR)"))'

# Both images built with podman from bases made here (no registry needed), then run:
# the operator answers --help, the worker passes a real qualification. Installs podman,
# runc and mmdebstrap from Debian when missing. With REGISTRY=host[:port]/path, both are
# then tagged $(REGISTRY)/resumequal-operator:TAG and $(REGISTRY)/resumequal-worker:TAG
# (IMAGE_TAG, default the project's version) and pushed; REGISTRY_TLS_VERIFY=false for a
# registry without TLS. See docs/cluster.md, "Images".
REGISTRY ?=
IMAGE_TAG ?=
PUSH_ARGS = $(if $(REGISTRY),--registry '$(REGISTRY)') $(if $(IMAGE_TAG),--tag '$(IMAGE_TAG)')
images:
	python3 tools/images.py all --torch '$(TORCH_SPEC)' $(PUSH_ARGS)

images-build:
	python3 tools/images.py build --torch '$(TORCH_SPEC)'

images-smoke:
	python3 tools/images.py smoke

images-push:
	python3 tools/images.py push $(PUSH_ARGS)

bench: env
	$(PY) bench/trace_overhead.py
	$(PY) bench/harness_overhead.py
	$(PY) bench/restart_latency.py
	$(PY) bench/compare_drift.py

# The trace's digests on this machine's GPU at 1B parameters: each algorithm's share of a
# step, and the fingerprint's GB/s against the device's own copy GB/s (targets: <= 3% and
# >= 50%).
bench-device: env bytecode
	$(PY) bench/trace_overhead.py --device cuda --size 1b --steps 6 --bandwidth

# The NCCL cells (DDP fp32, DDP bf16, FSDP2 bf16, compile) on this machine's GPUs with the
# default launcher, in under ten minutes on one GPU; a Markdown table. TORCH_SPEC should be
# a CUDA build there (e.g. TORCH_SPEC=torch==2.14.1).
gpu-check: env bytecode
	$(PY) tools/gpu_check.py

# The project on other torch pins: a venv per pin under build/compat/venvs (kept and
# reused), the default qualification and one run per feature, a pin x feature table in
# build/compat/compat.md (docs/compatibility.md). Each pin but 2.13.0 is a CUDA build of
# several GB. FEATURES: all, or some of default,fsdp2-bf16,compile,loader,resize,async-save,fp16.
PINS ?= 2.6.0 2.9.1 2.13.0 2.14.1
FEATURES ?= all
compat:
	python3 tools/compat.py --features '$(FEATURES)' $(PINS)

# The venvs of `make compat` alone (downloads and disk writes, little CPU).
compat-env:
	python3 tools/compat.py --venvs-only $(PINS)

# The local cluster (testing/cluster): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, helm, CoreDNS, the Kubeflow training operator, Trainer and JobSet,
# and SeaweedFS, built from their pinned Go modules into build/cluster/bin (reused while the
# pins hold), then started on this machine with the node agent and the chart installed.
# Needs root (pods run in network namespaces of their own). `make cluster-down` stops
# everything it started.
CLUSTER := PYTHONPATH=. $(PY) -m testing.cluster
cluster-build: env
	$(CLUSTER) build

cluster-up: env bytecode
	$(CLUSTER) up

cluster-down: env
	$(CLUSTER) down

clean:
	rm -rf $(VENV) runs build/images .pytest_cache .mypy_cache .ruff_cache
