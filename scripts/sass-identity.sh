#!/usr/bin/env bash
# Whether two builds hold the same machine code, without a GPU: scripts/sass-identity.sh OLD NEW
# OLD and NEW are build folders (or folders holding copies of their libraries). Every kernel library
# lib*.a at the top of OLD or NEW (SASS_LIBS: these names instead) is dumped from both with
# `cuobjdump --dump-sass --dump-resource-usage` and compared kernel by kernel
# (scripts/lib/sass_identity.py): only the names a rename changes are normalized, and a kernel
# renamed with the same code pairs up with its old self by its normalized body; the kernels of a
# library only NEW has are only in NEW. For refactors that must not change a bit of device code.
# The last line is "SASS identical: N kernels" (exit status 0) or "FAILED: <kernels or libraries>"
# (exit status 1: a kernel differs, or is only in one build, or a library is missing or unreadable).
# cuobjdump: CUOBJDUMP, else on PATH, else /usr/local/cuda/bin (it needs nvdisasm beside it or on
# PATH; where the toolkit lacks them: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old="${1:?usage: scripts/sass-identity.sh OLD_BUILD NEW_BUILD}"
new="${2:?usage: scripts/sass-identity.sh OLD_BUILD NEW_BUILD}"
summary_width=48
source "$root/scripts/lib/summary.sh"
dumps=$(mktemp -d)
trap 'rm -rf "$dumps"' EXIT
mkdir -p "$dumps/old" "$dumps/new"

cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}"
if [ ! -x "$cuobjdump" ]; then
  echo "FAILED: cuobjdump not found (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
  exit 1
fi

if [ -n "${SASS_LIBS:-}" ]; then
  libs=($SASS_LIBS)
else
  libs=()
  for path in "$old"/lib*.a; do [ -f "$path" ] && libs+=("$(basename "$path")"); done
  for path in "$new"/lib*.a; do [ -f "$path" ] && [ ! -f "$old/$(basename "$path")" ] && libs+=("$(basename "$path")"); done
fi
if [ "${#libs[@]}" -eq 0 ]; then
  echo "FAILED: no lib*.a in $old"
  exit 1
fi

echo "==== SASS of ${#libs[@]} libraries: $old vs $new"
for lib in "${libs[@]}"; do
  for side in old new; do
    dir=$old
    [ "$side" = new ] && dir=$new
    if [ "$side" = old ] && [ -z "${SASS_LIBS:-}" ] && [ ! -f "$old/$lib" ]; then
      : >"$dumps/old/$lib.sass"  # a library only in NEW: none of its kernels has an old self
    elif [ ! -f "$dir/$lib" ]; then
      record_failed "$lib" "missing in ${side^^} ($dir)"
    elif ! "$cuobjdump" --dump-sass --dump-resource-usage "$dir/$lib" >"$dumps/$side/$lib.sass" 2>"$dumps/$side/$lib.err" &&
        ! grep -q "does not contain device code" "$dumps/$side/$lib.err"; then  # a host library: no kernels
      record_failed "$lib" "cuobjdump failed on ${side^^}: $(tail -1 "$dumps/$side/$lib.err")"
      rm -f "$dumps/$side/$lib.sass"
    fi
  done
  [ -f "$dumps/old/$lib.sass" ] && [ -f "$dumps/new/$lib.sass" ] || rm -f "$dumps/old/$lib.sass" "$dumps/new/$lib.sass"
done

kernels=0
touch "$dumps/verdicts.tsv"
if ! python3 "$root/scripts/lib/sass_identity.py" "$dumps/old" "$dumps/new" "$dumps/verdicts.tsv"; then
  record_failed "sass_identity.py" "the comparison failed"
fi
while IFS=$'\t' read -r kind lib what renamed total; do
  case "$kind" in
    identical)
      kernels=$((kernels + what))
      text="$what kernels identical"
      [ "$what" -eq "$total" ] || text="$what of $total kernels identical"
      [ "$renamed" -eq 0 ] || text+=" ($renamed of them renamed)"
      [ "$total" -gt 0 ] || text="no kernels"
      record "$lib" "$text" ;;
    *) record_failed "$what" "$kind ($lib)" ;;
  esac
done <"$dumps/verdicts.tsv"

[ "$kernels" -gt 0 ] || [ "${#failed_steps[@]}" -gt 0 ] || record_failed "no kernels" "none in the libraries compared"
print_summary
if [ "${#failed_steps[@]}" -eq 0 ]; then
  echo "SASS identical: $kernels kernels"
  exit 0
fi
verdict
