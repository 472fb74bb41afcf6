# Two entry points for a fresh machine (see README): `make demo` (provision, deploy, bench and status on the
# local demo host of inventory.yaml) and `make test` (the whole suite; .ci/run calls it). For the inner loop,
# `make test-quick` runs lint and every test not marked `slow` (the end-to-end ones) in a few minutes.
# Both build .venv first; the CPU test environment pins torch==2.13.0 (a local CPU wheel).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0

.PHONY: venv demo demo-pair sshd test test-quick lint

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

# The SSH tests start real sshd daemons (tests/sshd.py).
sshd:
	@command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server)

# pytest with extra arguments, on every core up to 4 (pytest-xdist), a test module to a worker so that its
# fixtures are built once: on 2 cores the suite takes ~15 min instead of ~22. Its exit 5 (no test
# collected) fails too.
pytest = $(BIN)/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadscope $(1); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

test: venv sshd lint
	$(call pytest)

test-quick: venv sshd lint
	$(call pytest,-m "not slow")

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
