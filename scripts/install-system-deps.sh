#!/usr/bin/env bash
# Install the Debian packages clotho's local sandbox needs (bubblewrap, util-linux for unshare,
# e2fsprogs for the sandboxes' own file systems),
# and Chromium with its driver for the viewer's browser test.
# Runs apt-get only when something is missing and we are root; otherwise says what to install.
set -euo pipefail

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v git >/dev/null 2>&1 || missing+=(git)
# Storage limits the kernel enforces: each local sandbox's state folder (and each container's
# writable layer) is an ext4 of its own, made from a template by mkfs.ext4 and loop-mounted.
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
# The verifier's fallback for images whose find is busybox's is tested with busybox itself.
command -v busybox >/dev/null 2>&1 || missing+=(busybox-static)
# --network for local sandboxes: user-mode networking, and a rule that keeps the host's own
# services (the trajectory API on loopback) out of reach.
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
# The model gateway's relay inside a sandbox falls back to node where an image lacks python3.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
# The browser toolset (Chromium inside local sandboxes) and clotho view's browser test (chromedriver).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)  # the ssh backend's tests start a real sshd

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "clotho needs these Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
