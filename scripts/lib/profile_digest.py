#!/usr/bin/env python3
"""The digest of scripts/kernel-profile.sh: per profiled launch, in launch order, the figures that
say what a kernel waits on, from ncu's CSV (`--csv --print-units base`, sections SpeedOfLight,
MemoryWorkloadAnalysis, WarpStateStats, Occupancy, plus the DRAM bytes and the
smsp__average_warp_latency_issue_stalled_* metrics): values as ncu printed them, the stall reasons
largest first. Exit status 1 when the CSV holds no launch.

Usage: profile_digest.py PROFILE.csv
"""
import sys

from ncu_csv import metric_rows, short_kernel_name

# (label, ncu's metric name) in the order printed.
FIGURES = [
    ("duration", "Duration"),
    ("DRAM throughput", "DRAM Throughput"),
    ("memory throughput", "Memory Throughput"),
    ("DRAM bytes read", "dram__bytes_read.sum"),
    ("DRAM bytes written", "dram__bytes_write.sum"),
    ("L2 hit rate", "L2 Hit Rate"),
    ("achieved occupancy", "Achieved Occupancy"),
    ("warp cycles per issue", "Warp Cycles Per Issued Instruction"),
    ("SM active cycles, least", "sm__cycles_active.min"),
    ("SM active cycles, mean", "sm__cycles_active.avg"),
    ("SM active cycles, most", "sm__cycles_active.max"),
]
STALL = "smsp__average_warp_latency_issue_stalled_"
TOP_STALLS = 4


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def launches(path):
    """{id: (kernel name, grid, block, {metric: (value, unit)})} in launch order."""
    col, rows = metric_rows(path)
    out = {}
    for r in rows:
        entry = out.setdefault(r[col["ID"]], (short_kernel_name(r[col["Kernel Name"]]), r[col["Grid Size"]],
                                              r[col["Block Size"]], {}))
        entry[3].setdefault(r[col["Metric Name"]], (r[col["Metric Value"]], r[col["Metric Unit"]]))
    return out


def main():
    found = launches(sys.argv[1])
    if not found:
        print("no launch matched (the regex, or an OLD build without --profile-step?)")
        return 1
    for launch_id, (name, grid, block, metrics) in found.items():
        print(f"[{launch_id}] {name}  grid {grid} x block {block}")
        for label, metric in FIGURES:
            if metric in metrics:
                value, unit = metrics[metric]
                print(f"    {label:<24} {value:>16} {unit}")
        stalls = [(number(v), m[len(STALL):].replace(".ratio", "")) for m, (v, _) in metrics.items()
                  if m.startswith(STALL) and number(v) is not None]
        stalls.sort(reverse=True)
        if stalls:
            print("    top stalls               " +
                  ", ".join(f"{reason} {value:,.0f}" for value, reason in stalls[:TOP_STALLS]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
