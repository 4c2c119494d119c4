#!/usr/bin/env bash
# Installs the system packages the test suite needs, when missing:
# Ceph's monitor, OSD and RADOS Gateway (a real S3 server for the S3 tier tests).
set -euo pipefail
need=()
for bin in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool; do
  command -v "$bin" >/dev/null 2>&1 || need+=("$bin")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing Ceph (missing: ${need[*]}) for the S3 test server..." >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends ceph-mon ceph-osd radosgw ceph-common curl >/dev/null
