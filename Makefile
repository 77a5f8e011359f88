# whisperq: `make run` starts everything, `make test` runs the tests, `make docs` builds the
# documentation site (docs/, mkdocs.yml) into var/site/.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install check-deploy soak docs clean

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "whisperq needs Python 3.11 or newer; set PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/whisperq run

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The gRPC door's Python stubs (web/rpc/v1/, checked in) from its .proto, with
# `python -m grpc_tools.protoc` (web/rpc/protoc.py); tests/test_grpc.py fails when they drift.
.PHONY: proto
proto: $(STAMP)
	$(BIN)/python -m web.rpc.protoc

# Lint, format and types (configured in pyproject.toml); .ci/run runs it.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Benchmarks: `make bench-NAME` runs bench/NAME.py; each takes its size and its number of runs
# as BENCH_JOBS and BENCH_RUNS (or --jobs/--runs; see each file's docstring), e.g.
# `make bench-load BENCH_JOBS=60,200 BENCH_RUNS=3`. `make bench` is batching and latency.
#   batching    the engine by batch size and parallelism
#   latency     upload -> COMPLETED one job at a time, and the model's real-time factor
#   load        a burst: file-by-file scripts, the engine's ceiling, the service, a synchronous server
#   engines     faster-whisper vs openai-whisper; needs the openai-whisper extra (see .ci/run)
#   accuracy    word error rate on long recordings: faster-whisper's own pipelines beside the service
#   shadow      how far base's transcripts are from tiny.en's (whisperq models compare); needs .[base-model]
#   estimates   how far the jobs' estimated finish times are from the real ones, on a burst
#   scale       one inference host vs two (network namespaces of tests/hosts.py, one core each); needs root
#   encryption  plain vs encrypted files: write, read, and decoding a clip
# (bench/soak.py has its own target, `make soak`, below.)
BENCHES := batching latency load engines accuracy shadow estimates scale encryption hotwords speakers
.PHONY: bench bench-ci $(addprefix bench-,$(BENCHES))

bench: bench-batching bench-latency

$(addprefix bench-,$(BENCHES)): bench-%: $(STAMP)
	$(BIN)/python bench/$*.py

# Every benchmark here (soak too) at a tiny size, so none rots; fails if any fails (bench/ci.py).
bench-ci: $(STAMP)
	$(BIN)/python bench/ci.py

# The stack under a steady stream with bursts while its processes, its broker and PostgreSQL are
# SIGKILLed in turn (bench/soak.py, docs/soak.md); on the broker and database of CELERY_BROKER_URL
# and DATABASE_URL where set. SOAK_MINUTES=3 is the CI-size run (bench-ci). Fails if a job was lost,
# wrong, failed unexpectedly, went through the engine other than once (the engine ledger) or missed
# its webhook; from 20 minutes on, also if the stack's PSS grew over 10 % or /healthz was down over 2 s.
SOAK_MINUTES ?= 60
soak: $(STAMP)
	@$(BIN)/python -c 'import matplotlib, psutil' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

# The documentation site (mkdocs.yml, docs/) into var/site/: first a check that the checked-in
# configuration reference, the options page and the raw message's schema are what the settings'
# and the options' declarations write (`make reference` writes them),
# then --strict fails on any warning (a broken internal link or anchor, a page left out of the nav).
.PHONY: reference
reference: $(STAMP)
	$(BIN)/python -m config.reference docs/configuration/reference.md
	$(BIN)/python -m models.pipeline.request

docs: $(STAMP)
	@$(BIN)/python -c 'import mkdocs, material' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[docs]'
	$(BIN)/python -m config.reference --check docs/configuration/reference.md
	$(BIN)/python -m models.pipeline.request --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Static security scan of deploy/ (Kubernetes manifests, Dockerfile) with checkov, in a venv of
# its own: its pins clash with the project's. Skips are annotations in the files, each with why.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION ?= 3.3.30
$(CHECKOV_VENV)/.installed:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	@touch $@

check-deploy: $(CHECKOV_VENV)/.installed
	$(CHECKOV_VENV)/bin/checkov --directory deploy --framework kubernetes dockerfile --compact --quiet --skip-download

clean:
	rm -rf $(VENV) var .pytest_cache
