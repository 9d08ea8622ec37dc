#!/usr/bin/env bash
# Regenerates the checked-in Python code for protos/ into measure_agent/protocol/.
#
# The generator is pinned: grpcio-tools 1.66.2 (protoc 27.2) stamps gencode for protobuf 5.27.2
# and grpc 1.66.2, the oldest runtimes we support on devices (pinned in pyproject.toml). Newer
# generators would force every Jetson and Pi onto newer runtimes. Runs in a private venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TUNEFLEET_PROTOGEN_VENV:-"${TMPDIR:-/tmp}/tunefleet-protogen"}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc_tools, importlib.metadata as m; assert m.version("grpcio-tools") == "1.66.2"' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "grpcio-tools==1.66.2"
fi
cd "$root/protos"
find . -name '*.proto' -print0 | xargs -0 "$venv/bin/python" -m grpc_tools.protoc -I. \
  --python_out="$root" --pyi_out="$root" --grpc_python_out="$root"
echo "generated from $(find . -name '*.proto' | wc -l) proto file(s) with grpcio-tools 1.66.2"
