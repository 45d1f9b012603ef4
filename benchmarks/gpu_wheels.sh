#!/usr/bin/env bash
# The wheels a bare offline GPU image (Python 3.12, x86-64, jax 0.11.2 and the rest already there)
# lacks for actlab, downloaded here into DIR for `gpu_suite.sh DIR` or `ladder_gpu.sh DIR` there.
# promise has no wheel on PyPI: one is built from its sdist.
# Usage: bash benchmarks/gpu_wheels.sh [DIR]   (default .whl)
set -euo pipefail
DIR=${1:-.whl}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$DIR" \
  ml_collections tensorboardX tensorflow-datasets importlib_resources array_record dm-tree \
  immutabledict simple-parsing docstring-parser tensorflow-metadata termcolor toml
python3 -m pip wheel -q --no-deps -w "$DIR" promise
ls "$DIR"
