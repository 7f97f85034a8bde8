#!/bin/bash
# Builds `marshal` with burn's LibTorch backend (`--features tch`, `--device libtorch`).
#
# tch 0.22 (what burn 0.22 pins) links LibTorch 2.9.0. No system install is needed: this
# script puts PyTorch 2.9.0 from PyPI into a virtual environment (about 4 GB with its
# CUDA libraries) and lets torch-sys take LibTorch from it (`LIBTORCH_USE_PYTORCH=1`).
# The default build, the tests and CI never need any of this.
#
# Usage, from the repository root:
#   bash scripts/build-tch.sh [cargo build arguments, e.g. --release]
# then run the binary with LibTorch's libraries on the loader's path:
#   LD_LIBRARY_PATH=$(bash scripts/build-tch.sh --print-lib-dir) target/tch/release/marshal …
set -euo pipefail

VENV=${MARSHAL_TORCH_VENV:-target/torch-venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -W ignore -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.9.0")' 2>/dev/null; then
    "$VENV/bin/pip" install --progress-bar off torch==2.9.0 >&2
fi
LIB_DIR=$("$VENV/bin/python" -W ignore -c 'import torch, pathlib; print(pathlib.Path(torch.__file__).parent / "lib")')

if [ "${1:-}" = "--print-lib-dir" ]; then
    echo "$LIB_DIR"
    exit 0
fi

# Its own target directory: the feature changes burn's build, and sharing `target/` would
# rebuild the default one back and forth.
PATH="$VENV/bin:$PATH" LIBTORCH_USE_PYTORCH=1 CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/tch} \
    cargo build --features tch --bin marshal "$@"
echo "built; run with LD_LIBRARY_PATH=$LIB_DIR" >&2
