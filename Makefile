# Two entry points for a fresh machine (see README): `make demo` (provision, deploy, bench and status on the
# local demo host of inventory.yaml) and `make test` (the whole suite; .ci/run calls it).
# Both build .venv first; the CPU test environment pins torch==2.13.0 (a local CPU wheel).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0

.PHONY: venv demo demo-pair test lint

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[runtime,dev]" "$(TORCH_PIN)"
	# z-lab's reference drafter, a test-only oracle: its pinned dependencies are not needed.
	$(BIN)/pip install -q --no-deps "dflash==0.1.0"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/fab provision
	$(BIN)/fab deploy
	$(BIN)/fab bench
	$(BIN)/fab status

# Regenerate the committed demo pair (demo_pair/): a stdlib-trained LM and its trained drafter (CPU, ~20 min).
demo-pair: venv
	nice -n 15 $(BIN)/python demo_pair/build.py

test: venv
	@command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
