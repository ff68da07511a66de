# Sourced by the device-call scripts, whose output folder the device tool brings back at most 8
# files of: pack_details DIR KEEP... moves every file under DIR but the files named KEEP (paths
# relative to DIR) into DIR/details.tgz, for a script's EXIT trap (so that a run cut short by its
# call's limit is packed too). Empty folders left behind are removed.
pack_details() {
  local dir=$1
  shift
  [ -d "$dir" ] || return 0
  local keep=" $* details.tgz " files=() f
  while IFS= read -r f; do
    case "$keep" in *" $f "*) ;; *) files+=("$f") ;; esac
  done < <(cd "$dir" && find . -type f | sed 's|^\./||' | sort)
  [ "${#files[@]}" -gt 0 ] || return 0
  if tar -C "$dir" -czf "$dir/.details.tgz.part" "${files[@]}"; then
    (cd "$dir" && rm -f "${files[@]}")
    mv "$dir/.details.tgz.part" "$dir/details.tgz"
    find "$dir" -mindepth 1 -type d -empty -delete
  else
    rm -f "$dir/.details.tgz.part"
  fi
}
