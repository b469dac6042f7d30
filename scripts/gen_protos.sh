#!/usr/bin/env bash
# Regenerate netskel/api/v1 from protos/. The proto tree mirrors the package:
# protos/netskel/api/v1/x.proto -> netskel/api/v1/x_pb2.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-.}
"$PY" -m grpc_tools.protoc -I protos \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  protos/netskel/api/v1/*.proto 2> >(grep -v "^Writing mypy" >&2)
