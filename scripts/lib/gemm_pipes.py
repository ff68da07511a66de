#!/usr/bin/env python3
"""One line of scripts/gemm-pipes.sh: a kernel's time, clock and the busy share of its tensor pipe,
shared-memory banks (reads, writes), L2 and DRAM, from ncu's CSV (`--csv --print-units base`, one
launch). Exit status 1 when the CSV holds no launch.

Usage: gemm_pipes.py LABEL CSV
"""
import sys

from ncu_csv import metric_rows, short_kernel_name

COLUMNS = [  # (metrics, the first present shown; heading, scale, format)
    (["gpu__time_duration.sum"], "ms", 1e-6, "{:8.3f}"),
    (["sm__cycles_elapsed.avg.per_second"], "GHz", 1e-9, "{:5.2f}"),
    (["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
      "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"], "tensor%", 1, "{:7.1f}"),
    (["l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed"], "smem rd%", 1, "{:8.1f}"),
    (["l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed"], "smem wr%", 1, "{:8.1f}"),
    (["lts__t_sectors.avg.pct_of_peak_sustained_elapsed"], "L2%", 1, "{:5.1f}"),
    (["dram__throughput.avg.pct_of_peak_sustained_elapsed"], "DRAM%", 1, "{:5.1f}"),
]


def main():
    label, path = sys.argv[1], sys.argv[2]
    col, rows = metric_rows(path)
    values, kernel = {}, None
    for r in rows:
        kernel = short_kernel_name(r[col["Kernel Name"]])
        values[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    if kernel is None:
        print(f"FAILED: no launch of '{label}' in {path}")
        return 1
    cells = []
    for names, h, scale, f in COLUMNS:
        m = next((n for n in names if n in values), None)
        cells.append((h, f.format(values[m] * scale) if m else "-".rjust(len(f.format(0)))))
    print(f"{label:24s} " + "  ".join(f"{h} {v}" for h, v in cells) + f"  {kernel[-70:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
