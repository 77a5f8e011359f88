# whisperq: `make run` starts everything, `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install check-deploy bench bench-load bench-engines bench-encryption bench-accuracy bench-estimates bench-shadow bench-scale clean

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

bench: $(STAMP)
	$(BIN)/python bench/batching.py
	$(BIN)/python bench/latency.py

bench-load: $(STAMP)
	$(BIN)/python bench/load.py

# faster-whisper vs openai-whisper; needs the openai-whisper extra (see .ci/run)
bench-engines: $(STAMP)
	$(BIN)/python bench/engines.py

# word error rate on long recordings: faster-whisper's own pipelines beside the service
bench-accuracy: $(STAMP)
	$(BIN)/python bench/accuracy.py

# how far base's transcripts are from tiny.en's (shadow decoding, whisperq models compare); needs .[base-model]
bench-shadow: $(STAMP)
	$(BIN)/python bench/shadow.py

# how far the jobs' estimated finish times are from the real ones, on a burst
bench-estimates: $(STAMP)
	$(BIN)/python bench/estimates.py

# one inference host vs two (network namespaces of tests/hosts.py, one core each), the same burst; needs root
bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py

# plain vs encrypted files: write, read, and decoding a clip
bench-encryption: $(STAMP)
	$(BIN)/python bench/encryption.py

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
