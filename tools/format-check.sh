#!/usr/bin/env bash
# Checks that every C/C++ source is formatted with the repository's
# .clang-format; with --fix, rewrites the files instead.
#
#   tools/format-check.sh          # exit 1 and list the files that differ
#   tools/format-check.sh --fix    # clang-format -i on all of them
#
# The files: tracked ones plus untracked ones that .gitignore does not
# exclude (so new files are checked before they are committed), never
# anything under a build directory. Outside a git checkout, every source
# under the tree is checked.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

fix=false
case "${1:-}" in
  --fix) fix=true ;;
  "") ;;
  *)
    echo "format-check: unknown argument '$1'; use --fix or nothing" >&2
    exit 2
    ;;
esac

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format-check: $CLANG_FORMAT not found; run tools/install-deps.sh" >&2
  exit 1
fi

list_sources() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- '*.h' '*.hpp' '*.cc' '*.c'
  else
    find . \( -name 'build*' -o -name .git \) -prune -o -type f \
      \( -name '*.h' -o -name '*.hpp' -o -name '*.cc' -o -name '*.c' \) -printf '%P\0'
  fi
}

files=()
while IFS= read -r -d '' f; do
  case "$f" in
    build*/* | */build*/*) continue ;;  # generated files in a build tree
  esac
  [[ -f $f ]] && files+=("$f")  # tracked but deleted in the work tree: skip
done < <(list_sources)

if [[ ${#files[@]} -eq 0 ]]; then
  echo "format-check: no sources found" >&2
  exit 1
fi

if $fix; then
  "$CLANG_FORMAT" -i --style=file "${files[@]}"
  echo "format-check: formatted ${#files[@]} files"
  exit 0
fi

# One clang-format run for the common case; per file only to name the culprits.
if "$CLANG_FORMAT" --dry-run -Werror --style=file "${files[@]}" >/dev/null 2>&1; then
  echo "format-check: ${#files[@]} files clean"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run -Werror --style=file "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if [[ ${#bad[@]} -ne 0 ]]; then
  echo "format-check: ${#bad[@]} of ${#files[@]} files are not clang-format clean:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "format-check: run tools/format-check.sh --fix (uses $("$CLANG_FORMAT" --version))" >&2
  exit 1
fi
echo "format-check: clang-format failed on the batch but on no single file; rerun it" >&2
exit 1
