# Sourced by the check scripts: the summary table they print last and the exit status. Set
# summary_width (the width of the name column) before sourcing.
#   record NAME TEXT          a row of the table
#   record_failed NAME TEXT   a row, and NAME counted among the failed steps
#   print_summary             the rows
#   verdict                   the final line, "FAILED: a, b" naming the failed steps or "all passed";
#                             its status is 1 when a step failed (the script's exit status)
summary=()
failed_steps=()
record() { summary+=("$(printf "%-${summary_width:-34}s %s" "$1" "$2")"); }
record_failed() {
  record "$1" "$2"
  failed_steps+=("$1")
}
print_summary() { [ "${#summary[@]}" -eq 0 ] || printf '%s\n' "${summary[@]}"; }
verdict() {
  if [ "${#failed_steps[@]}" -eq 0 ]; then
    echo "all passed"
    return 0
  fi
  local list
  printf -v list '%s, ' "${failed_steps[@]}"
  echo "FAILED: ${list%, }"
  return 1
}
