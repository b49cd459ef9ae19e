# The two commands a newcomer needs: `make run` and `make test`.
# Both create .venv and install everything on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

CHROMIUM := /usr/bin/chromium
# The suite's modules run on this many processes (pytest-xdist; each module keeps its own
# databases, Redis database and ports); TEST_PROCESSES=0 runs them in this one.
TEST_PROCESSES ?= 3
# The dashboard's scripts are checked by Biome (lint + format), pinned in package-lock.json.
NODE_STAMP := node_modules/.installed
BIOME := node_modules/.bin/biome

.PHONY: run test lint format clean chromium

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned, so that pip takes the wheels that lie on this machine's disk
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/resnet-service up

test: $(STAMP) chromium
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile

# The dashboard tests drive Debian's chromium (Playwright's own browser download cannot
# work offline); install it when it is missing and apt is there, else say what is needed.
chromium:
	@test -x $(CHROMIUM) || command -v apt-get >/dev/null || { \
		echo "make test needs $(CHROMIUM) for the dashboard's browser tests;" \
			"install Debian's chromium package" >&2; exit 1; }
	@test -x $(CHROMIUM) || apt-get install -y chromium \
		|| { apt-get update && apt-get install -y chromium; }

$(NODE_STAMP): package-lock.json
	npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

lint: $(STAMP) $(NODE_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIOME) ci --error-on-warnings

format: $(STAMP) $(NODE_STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
	$(BIOME) check --write

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache
