"""Builds the native ops against the installed TensorFlow during `pip install`.

Install with `pip install --no-build-isolation .` (or `-e .`) so the build sees
the TensorFlow it must match; the build needs g++ and make (see native/build_ops.py).
"""

import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithOps(build_py):
  """build_py that first compiles mxrec_pipeline/ops/_mxrec_ops.so."""

  def run(self):
    subprocess.run([sys.executable, "native/build_ops.py"], check=True)
    super().run()


setup(cmdclass={"build_py": BuildPyWithOps})
