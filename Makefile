# Two commands on a fresh machine:  `make run`  and  `make test`.
# Each creates .venv and installs what it needs from the project's own files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch; the 'train' extra's range then resolves without downloading CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
INSTALL := $(BIN)/python -m pip --disable-pip-version-check -q install --no-compile
# pip byte-compiles one file at a time (torch alone: about 40 s here); compileall writes the same .pyc files on every
# core. Like pip, it leaves a file that does not compile (a template shipped as .py) to be read as source.
COMPILE := $(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true

.PHONY: run test lint install install-dev release clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) -e .
	@$(COMPILE)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(INSTALL) "$(TORCH_SPEC)"
	$(INSTALL) -e ".[train,dev]"
	@$(COMPILE)
	@# The web page's browser test drives Debian's chromium; as root, install it (else that test says why it skips).
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q chromium chromium-driver >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; } \
	      || echo "note: could not install chromium; the browser test will be skipped"; \
	  else echo "note: install chromium and chromium-driver (apt) to run the browser test"; fi; fi
	@# The MQTT tests start Debian's mosquitto broker on a free port; as root, install it (else they say why they skip).
	@if ! command -v mosquitto >/dev/null && ! test -x /usr/sbin/mosquitto; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q mosquitto >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q mosquitto >/dev/null; } \
	      || echo "note: could not install mosquitto; the MQTT tests will be skipped"; \
	  else echo "note: install mosquitto (apt) to run the MQTT tests"; fi; fi
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

STATE ?= edge-state

## The main job: the daemon on the hot folder $(STATE)/inbox, shipped default model, ONNX Runtime on CPU.
run: $(VENV)/.installed
	@mkdir -p $(STATE)/inbox
	@echo "edge-agent: drop photos into $(STATE)/inbox (try: cp samples/*.jpg $(STATE)/inbox/); results: $(BIN)/edge-agent results --state-dir $(STATE); Ctrl-C stops."
	$(BIN)/edge-agent run --state-dir $(STATE)

## The test suite (installs torch CPU + test tools into the same venv), on two pytest-xdist workers: the tests marked
## both_cores run one at a time on one of them, the rest (mostly waiting on daemons and sockets) beside them (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

## Formatting and lint (ruff, configured in pyproject.toml); .ci/run runs it after the tests.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

## The shipped model's release (docs/model.md): train (resumable), calibrate, INT8, sign with the release key, write
## edge_agent/default_store, then the gate and replay photos beside it. About 32 minutes of training on 2 CPU cores, 3 more to finish.
DATA ?= ../shared/data/plantvillage
RELEASE_KEY ?= ../shared/release/edge-agent-release.key
FIELD ?= ../shared/data/field
## v4000's training (Lite0, 256 px, 8 epochs) is reused, not trained again (TRAINING_FROM= trains it anew).
TRAINING_FROM ?= edge_agent/default_store/v4000
release: $(VENV)/.installed-dev
	$(BIN)/edge-trainer release --data $(DATA) --key $(RELEASE_KEY) --out edge_agent/default_store --work train-work/release \
	  $(if $(wildcard $(FIELD)),--watch-field $(FIELD)) $(if $(wildcard $(TRAINING_FROM)),--training-from $(TRAINING_FROM))
	$(BIN)/python -m trainer.shipped_data --data $(DATA)

clean:
	rm -rf $(VENV) .pytest_cache
