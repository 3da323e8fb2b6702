#!/usr/bin/env bash
# tportd's container image in one command (make image):
#
#   deploy/build-image.sh [IMAGE]      (default localhost/tensorport/tportd:latest)
#   CUDA=13-0 deploy/build-image.sh    the GPU image (see the Containerfile)
#
# Installs Podman and mmdebstrap where they are missing (Debian: apt), makes
# the base image where it is missing (make-base-image.sh: no registry
# needed), then builds deploy/Containerfile.  The build stage is tagged too
# (IMAGE-build: the cache of the next build, ~2.7 GB of build dependencies)
# and its older, untagged versions are pruned, so that a changed
# install-deps.sh does not pile them up.  PODMAN_BUILD_OPTS adds options to
# `podman build` (e.g. "--ulimit nofile=20000:20000" where the default is
# above the host's hard limit); BASE picks another base image (e.g.
# docker.io/library/debian:bookworm-slim where a registry is reachable).
# Needs root (rootful Podman, apt) or a user whose Podman and mmdebstrap work.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${1:-localhost/tensorport/tportd:latest}"
BASE="${BASE:-localhost/tensorport-base:bookworm}"
CUDA="${CUDA:-}"

missing=()
for p in podman runc catatonit mmdebstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "build-image: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ "$BASE" = localhost/tensorport-base:bookworm ]; then
  ./deploy/make-base-image.sh "$BASE"
fi

# shellcheck disable=SC2206  # options split on purpose
opts=(${PODMAN_BUILD_OPTS:-})
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in build ""; do
  echo "build-image: podman build ${target:+--target $target }-t $IMAGE${target:+-$target}"
  podman build --format docker --network host "${opts[@]}" \
    --build-arg BASE="$BASE" --build-arg CUDA="$CUDA" \
    ${target:+--target "$target"} -t "$IMAGE${target:+-$target}" \
    -f deploy/Containerfile . >"$log" 2>&1 || {
    tail -40 "$log"
    echo "build-image: podman build failed" >&2
    exit 1
  }
done
podman image prune -f --filter label=tensorport.stage=build >/dev/null
echo "build-image: $IMAGE built"
