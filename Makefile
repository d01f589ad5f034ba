# Two commands for a newcomer with only Python:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test install install-test redis-server lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e '.[embedded]'

install-test: $(BIN)/python redis-server
	$(BIN)/pip install -q -e '.[test]'

# The tests need a real redis-server binary (they start private ones); install it when missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

demo: install
	$(BIN)/scheduler demo

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check scheduler tests bench
	$(BIN)/mypy

test: install-test lint
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/run.py --quick

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
