#!/usr/bin/env bash
# Make a local base image for execution-environment.yml where no container registry is reachable
# (docs/awx.md, "Execution environment"): Debian bookworm from debootstrap, Python in a venv at /opt/ee (Debian's
# system Python refuses ensurepip and pip), and a test-only stand-in for dnf, because ansible-builder's install
# script knows only dnf and microdnf. Then build the image with podman:
#   hack/ee-base.sh                                      # -> localhost/zjusct-cloud-ee-base:latest
#   ansible-galaxy collection build --output-path dist/
#   ansible-builder create -f execution-environment.yml -c context/ --output-filename Containerfile
#   podman build --isolation chroot --network host --build-arg PYCMD=/opt/ee/bin/python3 -t zjusct-cloud-ee context/
# Needs root, debootstrap and podman (Debian packages). The host's CA bundle is copied in so that pip trusts the
# same TLS proxies the host does.
set -euo pipefail
work=$(mktemp -d /var/tmp/zjusct-ee-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,git,openssh-client \
  bookworm "$work/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
chroot "$work/rootfs" /usr/bin/python3 -m venv /opt/ee
cat > "$work/rootfs/usr/bin/dnf" <<'SHIM'
#!/bin/sh
# Test-only stand-in for dnf on a Debian base image: ansible-builder's assemble script knows only dnf/microdnf.
set -e
cmd=$1; shift
case "$cmd" in
  install)
    pkgs=""
    for a in "$@"; do case $a in -*) ;; *) pkgs="$pkgs $a" ;; esac; done
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs ;;
  clean) apt-get clean ;;
  *) echo "dnf stand-in: '$cmd' is not supported" >&2; exit 1 ;;
esac
SHIM
chmod 755 "$work/rootfs/usr/bin/dnf"
cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
rm -f "$work"/rootfs/var/cache/apt/archives/*.deb
tar -C "$work/rootfs" -c . | podman import \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
  --change 'ENV PATH=/opt/ee/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "${1:-localhost/zjusct-cloud-ee-base:latest}"
