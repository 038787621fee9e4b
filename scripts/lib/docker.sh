# shellcheck shell=bash
# Sourced by the image scripts: pick a Docker client that can run BuildKit builds (`RUN --mount=...`).
# A client with the buildx plugin works; so does a client older than 23.0 whose builder has BuildKit built in
# (Debian bookworm's docker.io, /usr/bin/docker). A newer client without buildx cannot, even with
# DOCKER_BUILDKIT=1. DOCKER, when set, wins.
raytrain_docker_client() {
  if [ -n "${DOCKER:-}" ]; then echo "$DOCKER"; return; fi
  local candidates=() c major
  mapfile -t candidates < <(type -ap docker; [ -x /usr/bin/docker ] && echo /usr/bin/docker)
  for c in "${candidates[@]}"; do
    if "$c" buildx version >/dev/null 2>&1; then echo "$c"; return; fi
  done
  for c in "${candidates[@]}"; do
    major="$("$c" --version 2>/dev/null | sed -nE 's/^Docker version ([0-9]+)\..*/\1/p')"
    if [ -n "$major" ] && [ "$major" -lt 23 ]; then echo "$c"; return; fi
  done
  echo docker
}
