# Two commands on a fresh machine (see README):
#   make demo   set up .venv, build the student notebooks, autograde the built-in example class
#   make test   set up .venv and run the test suite (what CI runs)
#   make site   build the course website (every stage's notebook run) into website/_build/html
PYTHON ?= python3
VENV ?= .venv
# CI and this Makefile pin the CPU torch wheel that CI machines carry; the package itself only
# asks for a lower bound (torch>=2.3) so Colab's newer torch is never downgraded.
# Use another build with e.g. `make demo TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test notebooks check-notebooks site clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
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

clean:
	rm -rf autograde/demo autograde/class .pytest_cache
