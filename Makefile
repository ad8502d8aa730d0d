# Thin wrappers around scripts/dev.sh (which does the real work and is what CI runs).
# Pass pytest arguments with ARGS, e.g. `make test ARGS="-k commit -x"`.
DEV := scripts/dev.sh
ARGS ?=

.PHONY: setup test test-full unit stop lint docs bench-quick bench

setup:
	$(DEV) setup

test:
	$(DEV) test $(ARGS)

test-full:
	$(DEV) test --full $(ARGS)

unit:
	$(DEV) unit $(ARGS)

stop:
	$(DEV) stop

lint:
	$(DEV) lint

docs:
	$(DEV) docs

SCENARIO ?= pipelines

bench-quick:
	for s in throughput costs fanout pg_target pipelines; do .venv/bin/python -m bench $$s --quick || exit 1; done

bench:
	.venv/bin/python -m bench $(SCENARIO)
