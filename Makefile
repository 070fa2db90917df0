# Two commands on a fresh machine (see README):
#   make demo   set up .venv, build the student notebooks, autograde the built-in example class
#   make test   set up .venv and run the test suite (what CI runs)
#   make site   build the course website (every stage's notebook run) into website/_build/html
# Releasing (website/instructor/releasing.md): make release VERSION=0.2.0, then make tag; make release-check
PYTHON ?= python3
VENV ?= .venv
# CI and this Makefile pin the CPU torch wheel that CI machines carry; the package itself only
# asks for a lower bound (torch>=2.3) so Colab's newer torch is never downgraded.
# Use another build with e.g. `make demo TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test notebooks check-notebooks site site-class release tag release-check clean

setup: $(VENV)/.installed

# Reinstalled when the version or the repository address changes: both live in the installed package's
# metadata (the checkpoint's download URL is read from it, tests/test_releases.py compares them).
$(VENV)/.installed: pyproject.toml src/transformer_course/__init__.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[grading,postgres,dev,site]"
	touch $@

demo: setup
	$(BIN)/python -m quality.demo

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=30

# STAGE=03 (or 03_blocks; several: STAGE="01 03") builds or checks those stages only; without it, all eight.
ONLY := $(if $(STAGE),--only $(STAGE))

notebooks: setup
	$(BIN)/python -m transformer_course.authoring build $(ONLY)

check-notebooks: setup
	$(BIN)/python -m transformer_course.authoring check $(ONLY)

# The website (website/authors/website.md): pages from solutions/, run with an execution cache, so a
# second build re-runs only the pages whose code changed. SITE_OPTIONS: e.g. --fresh, --jobs 1, --short.
site: setup
	$(BIN)/python -m website.build $(SITE_OPTIONS)

# The class website: the student notebooks' pages (no model answer, rubric or solution of a graded exercise),
# for a class graded on this release (website/instructor/releasing.md, "Which edition").
site-class: setup
	$(BIN)/python -m website.build --class $(SITE_OPTIONS)

# A release: __version__ set, the package reinstalled, the notebooks rebuilt to name the new tag, and what is
# missing before tagging listed. Then: make test, commit, make tag, git push origin HEAD v$(VERSION).
release: setup
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=0.2.0 (website/instructor/releasing.md)" >&2; exit 2; }
	$(BIN)/python scripts/release.py version $(VERSION)
	$(MAKE) setup notebooks
	$(BIN)/python scripts/release.py check --untagged

tag: setup
	$(BIN)/python scripts/release.py tag

release-check: setup
	$(BIN)/python scripts/release.py check --remote

clean:
	rm -rf autograde/demo autograde/class .pytest_cache
