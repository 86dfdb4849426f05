#!/usr/bin/env bash
# Carry the finished runs of an evidence computation between machines that do not keep their
# artifact store (see evidence/README.md).
#   tools/evidence.sh restore [STORE]      move every bundle's results that STORE lacks into it
#   tools/evidence.sh bundle NAME [STORE]  pack STORE's results that no bundle holds yet into
#                                          evidence/NAME.tar.xz
# STORE is a folder store, by default FEDHET_STORE, else ./artifacts (fedhet's default). A result
# is a stored artifact (STAGE/KEY.zarr, with its zarr.json) or a diverged run's record
# (STAGE/KEY.partial/diverged.json); checkpoints, temporaries and locks never travel, and a
# result moves whole: one the store holds is left as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bundles=$here/evidence
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

usage() {
  echo "usage: tools/evidence.sh restore [STORE] | bundle NAME [STORE]" >&2
  exit 2
}

fail() {
  echo "tools/evidence.sh: $*" >&2
  exit 2
}

folder_store() {
  [[ $1 != *://* ]] ||
    fail "$1: a folder store only (copy an object store with fedhet artifacts pull)"
}

# the results under FOLDER, one relative path a line
results() {
  (cd "$1" && find . -mindepth 3 -maxdepth 3 \( -path './*/*.zarr/zarr.json' -printf '%h\n' \) \
    -o \( -path './*/*.partial/diverged.json' -printf '%p\n' \)) | sed 's:^\./::' | sort
}

# the results the committed bundles hold
bundled() {
  local bundle listing
  for bundle in "$bundles"/*.tar.xz; do
    [ -e "$bundle" ] || continue
    listing=$(tar -tJf "$bundle") || fail "$bundle: not a readable bundle"
    grep -E '^[^/]+/[^/]+(\.zarr/zarr\.json|\.partial/diverged\.json)$' <<<"$listing" |
      sed 's:/zarr\.json$::' || true
  done | sort -u
}

# whether STORE holds RESULT already; a diverged run's record also once its run is stored or
# its partial folder exists (a retry under way, or the record already there)
held() {
  local store=$1 result=$2
  case $result in
    */diverged.json) [ -e "$store/${result%/diverged.json}" ] ||
      [ -e "$store/${result%.partial/diverged.json}.zarr" ] ;;
    *) [ -e "$store/$result" ] ;;
  esac
}

restore() {
  local store=$1 bundle unpacked result moved kept
  folder_store "$store"
  mkdir -p "$store"
  for bundle in "$bundles"/*.tar.xz; do
    [ -e "$bundle" ] || continue
    unpacked=$(mktemp -d "$store/.restore-XXXXXX")  # on the store's disk: a move is a rename
    scratch+=("$unpacked")
    tar -xJf "$bundle" -C "$unpacked" || fail "$bundle: not a readable bundle"
    moved=0 kept=0
    while IFS= read -r result; do
      if held "$store" "$result"; then
        kept=$((kept + 1))
      else
        mkdir -p "$(dirname "$store/$result")"
        mv "$unpacked/$result" "$store/$result"
        moved=$((moved + 1))
      fi
    done < <(results "$unpacked")
    rm -rf "$unpacked"
    echo "$(basename "$bundle"): $moved results restored into $store, $kept already there"
  done
}

bundle() {
  local name=$1 store=$2 target=$bundles/$1.tar.xz missing done
  [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
    fail "bundle NAME: a letter or digit, then letters, digits, . _ -"
  [ -e "$target" ] && fail "$target exists; choose another NAME"
  folder_store "$store"
  [ -d "$store" ] || fail "$store: no such store"
  done=$(mktemp) missing=$(mktemp)
  scratch+=("$done" "$missing")
  bundled >"$done"
  results "$store" | comm -23 - "$done" >"$missing"
  if [ ! -s "$missing" ]; then
    echo "no result of $store is missing from evidence/"
    return
  fi
  mkdir -p "$bundles"
  XZ_OPT=-9 tar -cJf "$target" -C "$store" --sort=name --owner=0 --group=0 --numeric-owner \
    -T "$missing"
  echo "$(wc -l <"$missing") results into $target ($(du -h "$target" | cut -f1))"
}

case ${1:-} in
  restore) [ $# -le 2 ] || usage; restore "${2:-${FEDHET_STORE:-artifacts}}" ;;
  bundle) [ $# -ge 2 ] && [ $# -le 3 ] || usage; bundle "$2" "${3:-${FEDHET_STORE:-artifacts}}" ;;
  *) usage ;;
esac
