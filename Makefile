# Two entry points on a fresh clone: `make demo` and `make test`.
# Everything is installed from nothing: system packages (apt-get), the .venv
# (Python 3.11), Python packages, the native ops, the data.

PYTHON311 ?= $(shell command -v python3.11 2>/dev/null)
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
OPS_SO    := mxrec_pipeline/ops/_mxrec_ops.so
# Parallel compiles of `make native` when the caller gave no -j (with -jN, or
# under a parallel make, native/ops.mk shares the caller's job slots instead).
NATIVE_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
NATIVE_J = $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(NATIVE_JOBS))
GTEST_BIN := native/build/key_index_test
ROW_STORE_TEST := native/build/row_store_test
TIER_STORE_TEST := native/build/tier_store_test
DEVICE_CACHE_TEST := native/build/device_cache_test
ROW_INIT_TEST := native/build/row_init_test
KEY_INDEX_PROPERTY_TEST := native/build/key_index_property_test
ROW_OPTIMIZERS_TEST := native/build/row_optimizers_test
SEGMENT_COMBINE_TEST := native/build/segment_combine_test
SANITIZE  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all

.PHONY: all system-deps venv native native-test test test-fast test-lifecycle pytest lint format demo bench clean

all: native

system-deps:
	@if [ ! -f /usr/include/gtest/gtest.h ] || [ -z "$(PYTHON311)" ] || ! command -v g++ >/dev/null; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	    libgtest-dev g++ make python3.11 python3.11-venv python3.11-dev; \
	fi
	@# PostgreSQL server binaries for the sweep test on a real database (tests/sweep).
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; \
	fi

$(STAMP): requirements.txt pyproject.toml | system-deps
	$(or $(PYTHON311),python3.11) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(STAMP)

# The op library, one object per source file under native/build/ops (see
# native/ops.mk): a no-op when nothing changed, one compile per edited file.
native: $(STAMP)
	$(MAKE) -f native/ops.mk $(NATIVE_J) PY=$(PY)

$(GTEST_BIN): native/core/key_index.cc native/core/key_index.h native/core/status.h \
    native/core/huge_page_allocator.h \
    native/tests/key_index_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/key_index.cc native/tests/key_index_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(ROW_STORE_TEST): native/core/row_store.cc native/core/row_store.h native/core/key_index.cc \
    native/core/key_index.h native/core/huge_page_allocator.h native/core/status.h \
    native/tests/row_store_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/row_store.cc native/core/key_index.cc native/tests/row_store_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(TIER_STORE_TEST): native/core/tier_store.cc native/core/tier_store.h native/core/status.h \
    native/tests/tier_store_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/tier_store.cc native/tests/tier_store_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(ROW_OPTIMIZERS_TEST): native/core/row_optimizers.cc native/core/row_optimizers.h \
    native/core/key_index.cc native/core/key_index.h native/core/huge_page_allocator.h \
    native/tests/row_optimizers_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/row_optimizers.cc native/core/key_index.cc native/tests/row_optimizers_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(DEVICE_CACHE_TEST): native/core/device_cache.cc native/core/device_cache.h \
    native/core/status.h native/tests/device_cache_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/device_cache.cc native/tests/device_cache_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(ROW_INIT_TEST): native/core/row_init.cc native/core/row_init.h native/tests/row_init_test.cc \
    | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/row_init.cc native/tests/row_init_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

$(SEGMENT_COMBINE_TEST): native/core/segment_combine.cc native/core/segment_combine.h \
    native/tests/segment_combine_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/segment_combine.cc native/tests/segment_combine_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

# GoogleTest unit tests of the TF-free core, under ASan and UBSan.
$(KEY_INDEX_PROPERTY_TEST): native/core/key_index.cc native/core/key_index.h native/core/status.h \
    native/core/huge_page_allocator.h \
    native/tests/key_index_property_test.cc | system-deps
	mkdir -p native/build
	g++ -std=c++20 -O1 -g -Wall -Wextra -Werror $(SANITIZE) \
	  native/core/key_index.cc native/tests/key_index_property_test.cc \
	  -lgtest -lgtest_main -pthread -o $@

native-test: $(GTEST_BIN) $(ROW_STORE_TEST) $(TIER_STORE_TEST) $(DEVICE_CACHE_TEST) $(ROW_INIT_TEST) \
    $(KEY_INDEX_PROPERTY_TEST) $(ROW_OPTIMIZERS_TEST) $(SEGMENT_COMBINE_TEST)
	$(ROW_OPTIMIZERS_TEST)
	$(SEGMENT_COMBINE_TEST)
	$(GTEST_BIN)
	$(KEY_INDEX_PROPERTY_TEST)
	$(ROW_STORE_TEST)
	$(TIER_STORE_TEST)
	$(DEVICE_CACHE_TEST)
	$(ROW_INIT_TEST)

# pytest-xdist runs the tests on PYTEST_JOBS processes (default: one per core),
# each test file's tests spread by work stealing; --durations: the 40 slowest
# tests in every run's log, to keep the suite inside its 25-minute budget.
PYTEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
PYTEST_ARGS := -n $(PYTEST_JOBS) --dist worksteal

pytest: native
	$(PY) -m pytest -q $(PYTEST_ARGS) --durations=40 -m "not lifecycle" tests

# Every shipped config x fault point, killed then resumed by the CLI (docs/restarts.md);
# LIFECYCLE_SEED picks the random kill point of each config.
test-lifecycle: native
	$(PY) -m pytest -v --durations=20 -m lifecycle tests/lifecycle tests/keras/test_keras_lifecycle.py

# The style check: ruff's lint rules and yapf's formatting (Google style, 2-space
# indents, 100 columns; both configured in pyproject.toml). `make format` applies yapf.
LINT_PATHS := mxrec_pipeline builders tests benchmarks examples setup.py

lint: $(STAMP)
	$(VENV)/bin/ruff check --quiet $(LINT_PATHS)
	$(VENV)/bin/yapf --diff --recursive --parallel $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/yapf --in-place --recursive --parallel $(LINT_PATHS)

# The style check, the GoogleTest builds and the op library build share the cores
# (one make -j), then pytest.
test: $(STAMP)
	$(MAKE) $(NATIVE_J) lint native-test native
	$(MAKE) pytest

# The tests without markers slow, cluster, postgres and network (pyproject.toml).
test-fast: native
	$(PY) -m pytest -q $(PYTEST_ARGS) -m "not slow and not cluster and not postgres and not network" tests

DEMO_CONFIG := configs/movielens_listwise.yaml
DEMO_DIR    := runs/movielens_listwise

# The main job on real data: fetch MovieLens-100k, train, validate against the
# baseline, export a SavedModel, score a sample list with it.
demo: native
	$(VENV)/bin/mxrec-pipeline data fetch movielens_100k
	$(VENV)/bin/mxrec-pipeline train $(DEMO_CONFIG) --fresh --set pipeline.model_dir=$(DEMO_DIR)
	$(VENV)/bin/mxrec-pipeline predict $(DEMO_DIR)/export/latest_model --input examples/sample_lists.json

bench: native
	$(PY) benchmarks/bench_sparse_core.py

clean:
	rm -rf native/build $(OPS_SO) mxrec_pipeline/ops/_mxrec_ops.tf_version
