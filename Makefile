# The two commands: `make demo` and `make test`. Both do all the set-up they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
OPSBOOK := $(VENV)/bin/opsbook
SANDBOX ?= .sandbox/demo
SYSTEM_PACKAGES := openssh-server zsh

.PHONY: demo test setup system lint unit notebooks nbval sandbox-up sandbox-down bench clean

demo: setup
	$(OPSBOOK) sandbox up --dir $(SANDBOX)
	$(OPSBOOK) run 00_preflight -f $(SANDBOX)/deployment.yml --runs-dir runs; \
	  code=$$?; echo "the record is in the run folder printed above (under runs/)"; \
	  echo "stop the rehearsal host with: $(OPSBOOK) sandbox down --dir $(SANDBOX)"; exit $$code

test: setup lint
	$(VENV)/bin/pytest -q tests
	$(MAKE) --no-print-directory nbval

setup: system $(VENV)/.installed

# sshd and zsh for the rehearsal host: installed when missing and we are root, else explained.
system:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v zsh >/dev/null || missing="$$missing zsh"; \
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

lint: setup
	$(VENV)/bin/ruff check opsbook tests bench
	$(VENV)/bin/ruff format --check opsbook tests bench
	$(VENV)/bin/mypy

# nbval re-executes the notebooks against the rehearsal host their outputs were stored from.
nbval: setup
	$(OPSBOOK) sandbox up --dir $(SANDBOX)
	$(VENV)/bin/pytest -q -p no:cacheprovider --nbval notebooks \
	  --sanitize-with tests/nbval-sanitize.cfg; \
	  code=$$?; $(OPSBOOK) sandbox down --dir $(SANDBOX) >/dev/null; exit $$code

# Refresh the stored outputs of the notebooks from a run on the rehearsal host.
notebooks: setup
	$(OPSBOOK) sandbox up --dir $(SANDBOX)
	for nb in notebooks/*.ipynb; do \
	  (cd notebooks && ../$(VENV)/bin/papermill -k python3 --cwd . $$(basename $$nb) $$(basename $$nb)) || exit 1; \
	done

sandbox-down:
	$(OPSBOOK) sandbox down --dir $(SANDBOX)

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	-$(OPSBOOK) sandbox down --dir $(SANDBOX)
	rm -rf $(VENV) .sandbox runs *.egg-info
