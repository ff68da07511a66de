# Sourced by the PC-sampling scripts (gemm-stalls.sh, layer-stalls.sh). sass_digest STEM OUT NAME
# [TOP]: from ncu's report STEM.ncu-rep, its details page into STEM.details.txt and its SASS page's
# CSV into OUT/NAME.sass.csv, then the kernel's figures and scripts/lib/sass_stalls.py's digest (TOP
# instructions, 30 by default) printed and kept as OUT/NAME.txt.
sass_digest() {
  local stem=$1 out=$2 name=$3 top=${4:-30}
  local figures="Duration|Elapsed Cycles|SM Active Cycles|DRAM Throughput|L2 Cache Throughput|SM Frequency"
  ncu -i "$stem.ncu-rep" --page details >"$stem.details.txt" 2>&1
  ncu -i "$stem.ncu-rep" --page source --csv --print-source sass >"$out/$name.sass.csv" 2>&1
  {
    grep -E "$figures|Executed Instructions" "$stem.details.txt" | head -8
    python3 "$(dirname "${BASH_SOURCE[0]}")/sass_stalls.py" "$out/$name.sass.csv" "$top"
  } | tee "$out/$name.txt"
}
