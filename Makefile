VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-pg check lint typecheck bench proof chaos fmt clean

# --no-compile: bytecode is written by the first import of each module instead of
# compiling every installed file up front (half of the install's time).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	touch $(STAMP)

# The example agents' knowledge folder is (re)indexed first: unchanged files are skipped,
# edited ones replaced; a file that fails is named and the bot starts anyway.
run: $(STAMP)
	-$(PY) -m bot knowledge add agents/knowledge
	$(PY) -m bot run

check: lint typecheck

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy bot platforms agents tests bench

# The console's browser test needs Debian's chromium: installed here when missing (as root).
# Two pytest workers (the suite is CPU-bound: bot subprocesses, fake servers, PostgreSQL)
# that steal work, so the long end-to-end files never end the run on one worker. The type
# check runs beside them on the CPU they leave idle (they wait on timers) and its output
# follows pytest's; either failing fails `make test`.
test: lint
	scripts/ensure-chromium.sh
	@$(VENV)/bin/mypy bot platforms agents tests bench > $(VENV)/typecheck.log 2>&1 & \
	echo "$(VENV)/bin/pytest -q -n 2 --dist worksteal (mypy beside it)"; \
	$(VENV)/bin/pytest -q -n 2 --dist worksteal; tests=$$?; \
	wait $$!; types=$$?; \
	echo "$(VENV)/bin/mypy bot platforms agents tests bench"; cat $(VENV)/typecheck.log; \
	test $$tests -eq 0 && test $$types -eq 0

# The whole suite with a throwaway PostgreSQL server (what .ci/run does).
test-pg:
	scripts/with-postgres.sh $(MAKE) --no-print-directory test

# PostgreSQL (throwaway server) is there for the multi-process pipeline figure.
bench: $(STAMP)
	scripts/with-postgres.sh $(PY) -m bench

# The full fault suite (kills, retry storms, overload, model faults, hostile input);
# writes docs/RELIABILITY.md. `make test` runs a reduced, seeded version of it.
proof: $(STAMP)
	CHATFLOW_PROOF=full $(VENV)/bin/pytest tests/e2e -q -k proof -p no:cacheprovider

# The database chaos suite: a PostgreSQL primary and a synchronous standby (Debian's
# server, started and stopped by the suite; as root it runs them as `postgres`), three
# bots behind fault proxies, every fault in turn; writes its figures into
# docs/RELIABILITY.md. `make test` runs the two cheapest faults on the test server;
# the test server (scripts/with-postgres.sh) also carries them through PgBouncer here.
chaos: $(STAMP)
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql)
	CHATFLOW_CHAOS=full scripts/with-postgres.sh $(VENV)/bin/pytest tests/e2e/test_chaos_pg.py -q -s -p no:cacheprovider -n 0

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .venv-bench .mypy_cache .pytest_cache .ruff_cache
