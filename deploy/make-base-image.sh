#!/usr/bin/env bash
# Makes the base image of deploy/Containerfile without a container registry:
# a Debian 12 "minbase" root filesystem made by mmdebstrap from this machine's
# own apt sources (so from whatever mirror it uses), imported into Podman.
#
#   deploy/make-base-image.sh [IMAGE]     (default localhost/tensorport-base:bookworm)
#
# Once: nothing is done when IMAGE exists (FORCE=1 makes it again).  Where a
# registry is reachable, docker.io/library/debian:bookworm-slim does as well
# (podman build --build-arg BASE=...).  Needs root, podman and mmdebstrap.
set -euo pipefail

IMAGE="${1:-localhost/tensorport-base:bookworm}"
if [ "${FORCE:-0}" != 1 ] && podman image exists "$IMAGE"; then
  echo "make-base-image: $IMAGE exists"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The host's apt sources (its mirror), else Debian's; the image gets them as
# /etc/apt/sources.list.d/debian.sources, where Debian's own images have them
# (deploy/nng/build-nng.sh reads the mirror from there).
src=/etc/apt/sources.list.d/debian.sources
if ! grep -qs '^URIs:' "$src"; then
  src="$work/debian.sources"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$src"
fi
echo "make-base-image: mmdebstrap --variant=minbase bookworm from $src"
# shellcheck disable=SC2016  # $1 is the hook's, not ours
mmdebstrap --quiet --variant=minbase \
  --customize-hook='mv "$1"/etc/apt/sources.list.d/0000debian.sources "$1"/etc/apt/sources.list.d/debian.sources' \
  bookworm "$work/rootfs.tar" "$src"
podman import --quiet \
  --change 'CMD ["/bin/bash"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --message "Debian 12 minbase (mmdebstrap), tensorport's base" \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "make-base-image: $IMAGE made"
