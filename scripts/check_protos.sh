#!/usr/bin/env bash
# Fails when the committed generated code differs from what protos/ produces.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHON=${PYTHON:-python3} scripts/gen_protos.sh "$tmp"
status=0
for f in "$tmp"/netskel/api/v1/*; do
  name=$(basename "$f")
  if ! cmp -s "$f" "netskel/api/v1/$name"; then
    echo "generated code drifted from protos/: netskel/api/v1/$name (run scripts/gen_protos.sh)"
    status=1
  fi
done
exit $status
