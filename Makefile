# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
# Both create .venv (Python 3.12) when it is missing and install the project
# with its test and TPU-compiler extras; libtpu (~200 MB) is downloaded once
# and stays cached in .venv.

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export JAX_PLATFORMS ?= cpu

# jax 0.12 needs Python >= 3.12; the machine's default python3 may be older.
PYTHON312 := $(shell tools/find-python312)

.PHONY: demo test test-fast bench golden hf-fixtures clean-venv

# setuptools prints one notice on every editable install ("Editable
# installation ... folders in your working directory with the same name as
# your package"): general advice, not about this package, whose folders map to
# megakernel.* by pyproject either way. It is filtered by its message alone, so
# any other setuptools warning still shows (tests/test_install_quiet.py).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[test,tpu-aot,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/megakernel demo

# pytest exits 5 when a selection collects nothing: say so instead of failing.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q --durations=40; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected" >&2; exit 0; fi; exit $$rc

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) -m bench.run

golden: $(STAMP)
	$(PY) -m tests.backends.regen_golden

clean-venv:
	rm -rf $(VENV)

include tools/hf-fixtures.mk
