#!/usr/bin/env bash
# rdma-core's pyverbs (the RDMA prober's library) for one Python, from
# Debian 12's python3-pyverbs. Installing that package would pull in
# rdma-core and with it systemd and udev, so only its libraries come from
# apt and the package itself is unpacked into DEST and put on the Python's
# path by a .pth file. Debian 12 builds it for CPython 3.11 only.
#   scripts/install_pyverbs.sh PYTHON /abs/path/pyverbs
set -euo pipefail
PY=${1:?python}
DEST=${2:?destination directory}
case "$DEST" in  # emptied and refilled below: only a directory of its own
  /*/pyverbs) ;;
  *) echo "pyverbs: DEST must be an absolute path ending in /pyverbs, not '$DEST'" >&2; exit 2 ;;
esac
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "pyverbs: Debian's build is for Python 3.11, $PY is not" >&2
  exit 1
fi
apt-cache show python3-pyverbs >/dev/null 2>&1 || apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  libibverbs1 librdmacm1 ibverbs-providers >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chown _apt "$tmp" 2>/dev/null || true  # apt downloads as its own user where it exists
(cd "$tmp" && apt-get download -qq python3-pyverbs >/dev/null)
rm -rf "$DEST"
mkdir -p "$DEST"
dpkg -x "$tmp"/python3-pyverbs_*.deb "$DEST"
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEST/usr/lib/python3/dist-packages" > "$site/debian-pyverbs.pth"
"$PY" -c 'import pyverbs.device' && echo "pyverbs ready for $PY"
