#!/usr/bin/env bash
# Where this machine has a CUDA toolkit (NVVM and ptxas; no GPU needed), make a Python with
# numba-cuda for tests/test_cuda_templates.py's compile check (register tiles in registers, no
# spills, vector shared-memory loads in the SASS) and print the exports that turn the check on:
#   eval "$(.ci/cuda_check_env.sh)"
# Prints nothing (the check is skipped, with its reason) when there is no toolkit or the install
# fails. The interpreter is cached in ${XDG_CACHE_HOME:-/var/cache}/tunefleet-cuda-check.
set -uo pipefail
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -d "$cuda_home/nvvm" ] || ! command -v ptxas >/dev/null 2>&1; then
  echo "note: no CUDA toolkit at $cuda_home: the PTX/SASS check of the CUDA templates will be skipped" >&2
  exit 0
fi
venv="${XDG_CACHE_HOME:-/var/cache}/tunefleet-cuda-check"
if ! "$venv/bin/python" -c "import numba.cuda" >/dev/null 2>&1 \
   || ! compgen -G "$venv/lib/python*/site-packages/nvidia/cu13/bin/nvdisasm" >/dev/null; then
  rm -rf "$venv"
  if ! { python -m venv "$venv" && "$venv/bin/pip" install -q numba numba-cuda nvidia-cuda-nvrtc nvidia-cuda-nvdisasm \
           nvidia-cuda-cuobjdump >&2; }; then
    echo "warning: could not install numba-cuda for the PTX/SASS check: it will be skipped" >&2
    exit 0
  fi
fi
tools="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin"))' 2>/dev/null)"
echo "export TUNEFLEET_CUDA_PYTHON='$venv/bin/python' CUDA_HOME='$cuda_home'"
if [ -n "$tools" ] && [ -d "$tools" ]; then
  echo "export PATH=\"\$PATH:$tools\""
fi
