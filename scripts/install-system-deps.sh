#!/usr/bin/env bash
# Installs the system packages the test suite needs, when missing:
# - Ceph's monitor, OSD and RADOS Gateway (a real S3 server for the S3 tier tests);
# - Debian's chromium (headless: the dashboard tests render `mouthguard serve`'s page).
set -euo pipefail
need_ceph=()
for bin in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool; do
  command -v "$bin" >/dev/null 2>&1 || need_ceph+=("$bin")
done
packages=()
[ ${#need_ceph[@]} -gt 0 ] && packages+=(ceph-mon ceph-osd radosgw ceph-common curl)
command -v chromium >/dev/null 2>&1 || packages+=(chromium fonts-dejavu-core)
[ ${#packages[@]} -eq 0 ] && exit 0
echo "installing ${packages[*]} (Ceph for the S3 test server, chromium for the dashboard tests)..." >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
