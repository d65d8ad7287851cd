"""Builds the TF custom-op library against the installed TensorFlow.

The build is native/ops.mk: one object per translation unit under
native/build/ops/, compiled in parallel, linked into
mxrec_pipeline/ops/_mxrec_ops.so, with the TensorFlow version it was built for
beside it (_mxrec_ops.tf_version, checked by mxrec_pipeline.ops at load time).
`make native` runs ops.mk directly; setup.py's build_py runs this script, which
runs ops.mk (so `pip install` needs `make` and `g++`).

This script also gives ops.mk the flags of the TensorFlow the running Python
imports (tf.sysconfig.get_compile_flags / get_link_flags), as make variables.

Usage:
  python native/build_ops.py [--debug] [--jobs N]  # build (default: all CPUs)
  python native/build_ops.py --make-vars FILE      # (re)write ops.mk's TF flags
"""

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fingerprint():
  """Where the installed TensorFlow is and when it was installed, without importing it."""
  spec = importlib.util.find_spec("tensorflow")
  if spec is None or not spec.origin:
    raise SystemExit(f"TensorFlow is not installed for {sys.executable}; "
                     "the native ops are built against it (see requirements.txt).")
  return f"{spec.origin} of mtime {os.stat(spec.origin).st_mtime_ns}"


def _make_value(flags):
  """`flags` as one make variable value ('$' and '#' escaped)."""
  return " ".join(flags).replace("$", "$$").replace("#", r"\#")


def write_make_vars(path):
  """Writes TF_VERSION, TF_CFLAGS and TF_LFLAGS to `path` for native/ops.mk.

  Leaves `path` untouched (so make neither restarts nor rebuilds) when it was
  written for the same TensorFlow by this same script; imports TensorFlow only
  otherwise.
  """
  path = pathlib.Path(path)
  script = pathlib.Path(__file__)
  header = (f"# Written by {script.name} of mtime {script.stat().st_mtime_ns} "
            f"for {_fingerprint()}.\n")
  if path.exists() and path.read_text().startswith(header):
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Keep TF's start-up logs out of the build.
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  path.write_text(header +
                  f"TF_VERSION := {tf.__version__}\n"
                  f"TF_CFLAGS := {_make_value(tf.sysconfig.get_compile_flags())}\n"
                  f"TF_LFLAGS := {_make_value(tf.sysconfig.get_link_flags())}\n")


def build(debug, jobs):
  """Runs native/ops.mk with this Python's TensorFlow, `jobs` compiles at once."""
  # A parent make's jobserver does not reach us through pip: drop its flags.
  env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
  command = ["make", "-f", "native/ops.mk", f"-j{jobs}", f"PY={sys.executable}",
             f"MODE={'debug' if debug else 'release'}"]
  print(" ".join(command), flush=True)
  subprocess.run(command, cwd=ROOT, env=env, check=True)


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--debug", action="store_true", help="-O0 -g instead of -O3")
  parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                      help="parallel compiles (default: the CPUs available)")
  parser.add_argument("--make-vars", metavar="FILE",
                      help="write the TF flags for native/ops.mk to FILE and exit")
  args = parser.parse_args(argv)
  if args.make_vars:
    write_make_vars(args.make_vars)
  else:
    build(args.debug, args.jobs)


if __name__ == "__main__":
  main(sys.argv[1:])
