# fedhet: `make install`, `make test`, `make quickstart`, `make reproduce`, `make bench`, `make lint`,
# `make docs`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reproduction specs run by `make reproduce`; each writes reports/<name>.md, .png, .svg and .pdf.
# Each spec runs on one thread, so `make -j2 reproduce` uses two cores (two specs at a time).
REPRO_SPECS := specs/quickstart.yaml specs/tct_fmnist.yaml specs/vhl_fmnist.yaml specs/vhl_fmnist_official.yaml specs/vhl_fmnist_official_long.yaml specs/vhl_fmnist_feddf.yaml specs/vhl_fmnist_feddf_epochs_real.yaml specs/vhl_fmnist_gn.yaml specs/vhl_fmnist_standardized.yaml specs/fedimpro_fmnist.yaml specs/fedimpro_fmnist_long.yaml specs/fedimpro_fmnist_long_500.yaml specs/fedimpro_fmnist_weight.yaml specs/fedbr_fmnist.yaml specs/fedbr_fmnist_long.yaml specs/fedbr_fmnist_long_momentum.yaml specs/fedbr_fmnist_skew.yaml specs/fedbr_fmnist_skew_480.yaml specs/fedbr_fmnist_skew_momentum.yaml specs/fedtan_fmnist.yaml specs/fedtan_fmnist_gn.yaml specs/fedtan_fmnist_client_test.yaml specs/all_methods_fmnist.yaml specs/tct_fmnist_paper.yaml specs/fednova_fmnist.yaml specs/synthetic.yaml
REPORTS := $(patsubst specs/%.yaml,report-%,$(REPRO_SPECS))
# Reproductions whose methods' hyperparameters `fedhet tune` selects first (reports/NAME_tuned.md)
TUNED_SPECS := specs/tct_fmnist_table3.yaml specs/fedbr_fmnist_table1.yaml specs/fedbr_fmnist_table1_momentum.yaml
TUNED_REPORTS := $(patsubst specs/%.yaml,report-tuned-%,$(TUNED_SPECS))
# the row a report pairs the others with, where it is not the spec's first algorithm
BASELINE_fedbr_fmnist_table1 := FedAvg (momentum=0.9)
BASELINE_fedbr_fmnist_table1_momentum := FedAvg (momentum=0.9)
# a second report of the same runs, NAME_vs_SLUG_tuned.md, paired with another row: a paper's
# ordering among its methods (TCT > FedDyn > FedAdam)
SECOND_BASELINE_tct_fmnist_table3 := FedDyn
SECOND_SLUG_tct_fmnist_table3 := feddyn

.PHONY: install lock test lint docs docs-check quickstart reproduce readme clean-tree bench bench-venvs clean $(REPORTS) $(TUNED_REPORTS)

install: $(VENV)/.installed

# Exactly the lock: every package pinned with its hashes, nothing resolved at install time.
$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $@

# Refresh the lock after editing the dependencies in pyproject.toml (pip-tools, see README).
lock:
	$(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install --quiet pip-tools
	.lockenv/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
		--extra dev --extra ray -o requirements.lock pyproject.toml

test: install
	$(BIN)/pytest

# ruff (rules, then formatting), then the import contracts in pyproject.toml (layers,
# independent methods, no cycles)
lint: install
	$(BIN)/ruff check fedhet tests benchmarks tools
	$(BIN)/ruff format --check fedhet tests benchmarks tools
	$(BIN)/lint-imports --no-cache

# The documentation site (mkdocs.yml: docs/, API pages from the docstrings) into build/site, every
# warning an error. NO_MKDOCS_2_WARNING: silences Material's banner about MkDocs 2 and its own end
# of life (May 2027), which says nothing about this site.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The built site as a reader sees it (tools/docs_check.py): no paragraph cut off mid-sentence, no
# markdown left unrendered; with Debian's chromium, a PNG of the home, command line and plug-in
# API pages in build/screenshots to look at (skipped, saying so, without it).
docs-check: docs
	$(BIN)/python tools/docs_check.py build/site --screenshots build/screenshots

quickstart: install
	$(BIN)/fedhet train specs/quickstart.yaml

reproduce: $(REPORTS) $(TUNED_REPORTS)

# A committed report must be computed from committed code (its header names the commit):
# refuse a tree with uncommitted changes outside reports/ (which reproduce writes);
# `make reproduce ALLOW_DIRTY=1` for experiments.
clean-tree:
	@if [ -z "$(ALLOW_DIRTY)" ] && [ -n "$$(git status --porcelain --untracked-files=no -- . ':!reports')" ]; then \
		echo "make reproduce: the tree has uncommitted changes; commit them first (a report names the commit it was computed from), or pass ALLOW_DIRTY=1 for an experiment" >&2; \
		exit 2; \
	fi

$(REPORTS): report-%: install clean-tree
	$(BIN)/fedhet report specs/$*.yaml --out reports --train

$(TUNED_REPORTS): report-tuned-%: install clean-tree
	$(BIN)/fedhet tune specs/$*.yaml
	$(BIN)/fedhet report specs/$*.yaml --tuned --train --out reports $(if $(BASELINE_$*),--baseline '$(BASELINE_$*)')
	$(if $(SECOND_BASELINE_$*),$(BIN)/fedhet report specs/$*.yaml name=$*_vs_$(SECOND_SLUG_$*) --tuned --out reports --baseline '$(SECOND_BASELINE_$*)')

# The documentation's result tables (docs/results/), rewritten from the committed reports
# (reports/readme.yaml).
readme: install
	$(BIN)/python -m fedhet.reports.readme

# the reference simulators the benchmarks compare with, each in a venv of its own (not the lock)
bench-venvs:
	python3 -m venv .bench/pfl
	.bench/pfl/bin/pip install --quiet pfl==0.6.0 torch==2.14.1

bench: install
	$(BIN)/python -m benchmarks.engine_overhead
	$(BIN)/python -m benchmarks.checkpoint_cost
	$(BIN)/python -m benchmarks.run_overhead --against a9f283c
	$(BIN)/python -m benchmarks.entk_speed
	$(BIN)/python -m benchmarks.stage2_speed
	$(BIN)/python -m benchmarks.sweep_throughput
	$(BIN)/python -m benchmarks.cross_device
	$(BIN)/python -m benchmarks.synthetic_rounds
	$(BIN)/python -m benchmarks.threads_under_load
	$(BIN)/python -m benchmarks.stored_commands
	$(BIN)/python -m benchmarks.object_store

clean:
	rm -rf $(VENV) .lockenv artifacts .pytest_cache
