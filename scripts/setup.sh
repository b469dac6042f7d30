#!/usr/bin/env bash
# Installs everything netskel, its testbed and its tests need on a fresh
# Debian machine (run as root): system tools from apt, Python deps in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
# chromium renders the web page in its end-to-end test; prometheus (and its
# promtool) checks, unit-tests and evaluates deploy/prometheus's alerts, in
# the tests, the testbed and the demo.
pkgs=(openvswitch-switch ethtool iptables nftables iproute2 iputils-ping chromium prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# kubectl renders the deployment manifests in the tests; Debian's package is the fallback.
command -v kubectl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends kubernetes-client >/dev/null 2>&1 || echo "no kubectl: manifest tests will skip"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[dev]'
# Optional: real training traffic in the testbed tests. The CPU wheel is on
# this machine image's local disk; where it cannot be installed, the test
# that needs it skips and says why.
.venv/bin/pip install -q torch==2.13.0 >/dev/null 2>&1 || echo "torch not installable here: the real-traffic test will skip"
# Optional: rdma-core's pyverbs, so the tests build the RDMA prober's verbs
# objects on the real library (pinging needs a device; none here).
.venv/bin/python -c 'import pyverbs.device' 2>/dev/null \
  || scripts/install_pyverbs.sh .venv/bin/python "$PWD/.venv/pyverbs" >/dev/null \
  || echo "pyverbs not installable here: the RDMA prober's library test will skip"
echo "setup done: .venv ready, system tools installed"
