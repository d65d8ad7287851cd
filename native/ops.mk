# Builds the TF custom-op library mxrec_pipeline/ops/_mxrec_ops.so, and beside
# it _mxrec_ops.tf_version (the TensorFlow it was built for, which
# mxrec_pipeline/ops/__init__.py checks at load time).
#
# One object per translation unit of native/{core,ops,kernels} under
# native/build/ops/, compiled in parallel (make -j) with header dependencies
# (-MMD -MP): an edit of one kernel recompiles that kernel and relinks; an edit
# of a header recompiles the files that include it.
#
# Run from the repository root, by `make native` (top-level Makefile) and by
# native/build_ops.py (setup.py's build_py):
#   make -f native/ops.mk -j2 PY=.venv/bin/python [MODE=debug]
# The compile and link flags of the installed TensorFlow (tf.sysconfig) are
# written to native/build/tf_flags.mk by `native/build_ops.py --make-vars`,
# again only when the TensorFlow that PY imports (or build_ops.py) changes.
# Every object depends on the full compile command
# (native/build/ops/compile_flags), so a new TensorFlow, MODE or CXX rebuilds
# everything.

PY    ?= python3
MODE  ?= release
BUILD := native/build
OBJ_DIR := $(BUILD)/ops
TF_MK := $(BUILD)/tf_flags.mk
OPS_SO := mxrec_pipeline/ops/_mxrec_ops.so
TF_VERSION_FILE := mxrec_pipeline/ops/_mxrec_ops.tf_version

SRCS := $(sort $(wildcard native/core/*.cc native/ops/*.cc native/kernels/*.cc))
OBJS := $(patsubst native/%.cc,$(OBJ_DIR)/%.o,$(SRCS))

# -fno-math-errno: std::sqrt and friends never set errno (nothing here reads
# it after math calls), so they compile to vector instructions: the fused row
# optimizers' loops run 1.7x faster (native/core/row_optimizers.cc).
# -fno-semantic-interposition: the library's own functions are never replaced
# by another library's at load time, so -fPIC code may inline them (without it,
# KeyIndex's Home and ProbeFrom stay out-of-line calls in the probing loops).
OPT_release := -O3 -DNDEBUG -fno-math-errno -fno-semantic-interposition
OPT_debug   := -O0 -g
ifeq ($(OPT_$(MODE)),)
  $(error MODE must be release or debug, got '$(MODE)')
endif
COMPILE = $(CXX) -fPIC -Wall -Wno-sign-compare $(OPT_$(MODE)) $(TF_CFLAGS)
LINK    = $(CXX) -shared

.PHONY: all FORCE
all: $(OPS_SO) $(TF_VERSION_FILE)

# Defines TF_VERSION, TF_CFLAGS and TF_LFLAGS. Checked on every run (cheap: no
# TensorFlow import unless it changed); make restarts only when it was rewritten.
include $(TF_MK)
$(TF_MK): FORCE
	@mkdir -p $(@D)
	@$(PY) native/build_ops.py --make-vars $@

# Writes $(1) to the target unless it holds it already: the flag files below
# change, and the objects depending on them rebuild, exactly when a command does.
write-if-changed = echo '$(1)' | cmp -s - $@ || echo '$(1)' > $@

$(OBJ_DIR)/compile_flags: FORCE
	@mkdir -p $(@D)
	@$(call write-if-changed,$(TF_VERSION) $(COMPILE))

$(OBJ_DIR)/link_flags: FORCE
	@mkdir -p $(@D)
	@$(call write-if-changed,$(TF_VERSION) $(LINK) $(TF_LFLAGS))

$(OBJ_DIR)/%.o: native/%.cc $(OBJ_DIR)/compile_flags
	@mkdir -p $(@D)
	$(COMPILE) -MMD -MP -c $< -o $@

$(OPS_SO): $(OBJS) $(OBJ_DIR)/link_flags
	$(LINK) $(OBJS) -o $@ $(TF_LFLAGS)

$(TF_VERSION_FILE): $(OPS_SO)
	echo $(TF_VERSION) > $@

FORCE:

-include $(OBJS:.o=.d)
