#!/usr/bin/env bash
# Carry the finished runs of an evidence computation between machines that do not keep their
# artifact store (see evidence/README.md).
#   tools/evidence.sh restore [STORE]      unpack every evidence/*.tar.xz into STORE
#   tools/evidence.sh bundle NAME [STORE]  pack STORE's results that no bundle holds yet into
#                                          evidence/NAME.tar.xz
# STORE defaults to FEDHET_STORE, else ./artifacts (fedhet's default). A result is a stored
# artifact (STAGE/KEY.zarr) or a diverged run's record (STAGE/KEY.partial/diverged.json);
# checkpoints, temporaries and locks are not results and never travel.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bundles=$here/evidence

usage() {
  echo "usage: tools/evidence.sh restore [STORE] | bundle NAME [STORE]" >&2
  exit 2
}

# the results of STORE, one relative path a line
results() {
  (cd "$1" && find . -mindepth 2 -maxdepth 2 -name '*.zarr' -type d -printf '%P\n' &&
    find . -mindepth 3 -maxdepth 3 -path '*.partial/diverged.json' -printf '%P\n') | sort
}

# the results the committed bundles hold
bundled() {
  for bundle in "$bundles"/*.tar.xz; do
    [ -e "$bundle" ] || continue
    tar -tJf "$bundle" | grep -E '^[^/]+/[^/]+(\.zarr/?|\.partial/diverged\.json)$' | sed 's:/$::'
  done | sort -u
}

restore() {
  local store=$1
  mkdir -p "$store"
  for bundle in "$bundles"/*.tar.xz; do
    [ -e "$bundle" ] || continue
    tar -xJf "$bundle" -C "$store" --skip-old-files
    echo "restored $(basename "$bundle") into $store"
  done
}

bundle() {
  local name=$1 store=$2 target=$bundles/$1.tar.xz
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "bundle NAME: letters, digits, . _ - only" >&2; exit 2; }
  [ -e "$target" ] && { echo "$target exists; choose another NAME" >&2; exit 2; }
  list=$(mktemp)  # global: the EXIT trap reads it after the function returns
  trap 'rm -f "$list"' EXIT
  comm -23 <(results "$store") <(bundled) >"$list"
  if [ ! -s "$list" ]; then
    echo "no result of $store is missing from evidence/"
    return
  fi
  mkdir -p "$bundles"
  XZ_OPT=-9 tar -cJf "$target" -C "$store" --sort=name --owner=0 --group=0 --numeric-owner \
    -T "$list"
  echo "$(wc -l <"$list") results into $target ($(du -h "$target" | cut -f1))"
}

command=${1:-}
case $command in
  restore) [ $# -le 2 ] || usage; restore "${2:-${FEDHET_STORE:-artifacts}}" ;;
  bundle) [ $# -ge 2 ] && [ $# -le 3 ] || usage; bundle "$2" "${3:-${FEDHET_STORE:-artifacts}}" ;;
  *) usage ;;
esac
