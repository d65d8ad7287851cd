"""Compiles the TF custom-op library against the installed TensorFlow.

Used by `make native` and by setup.py's build_ext. Writes
mxrec_pipeline/ops/_mxrec_ops.so and, beside it, the TensorFlow version it was
built for, which mxrec_pipeline.ops checks at load time.

Usage: python native/build_ops.py [--debug]
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ["native/core/key_index.cc", "native/ops/key_index_ops.cc",
           "native/kernels/key_index_kernels.cc", "native/core/row_store.cc",
           "native/ops/row_store_ops.cc", "native/kernels/row_store_kernels.cc"]
SOURCES += ["native/core/tier_store.cc", "native/ops/tier_store_ops.cc",
            "native/kernels/tier_store_kernels.cc"]
SOURCES += ["native/core/device_cache.cc", "native/ops/device_cache_ops.cc",
            "native/kernels/device_cache_kernels.cc"]
SOURCES += ["native/core/row_init.cc", "native/ops/row_init_ops.cc",
            "native/kernels/row_init_kernels.cc"]
OUTPUT = ROOT / "mxrec_pipeline" / "ops" / "_mxrec_ops.so"


def main(argv):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  optimize = ["-O0", "-g"] if "--debug" in argv else ["-O3", "-DNDEBUG"]
  command = (["g++", "-shared", "-fPIC", "-Wall", "-Wno-sign-compare", *optimize,
              *tf.sysconfig.get_compile_flags(), *[str(ROOT / s) for s in SOURCES],
              "-o", str(OUTPUT), *tf.sysconfig.get_link_flags()])
  print(" ".join(command), flush=True)
  subprocess.run(command, check=True)
  OUTPUT.with_suffix(".tf_version").write_text(tf.__version__ + "\n")


if __name__ == "__main__":
  main(sys.argv[1:])
