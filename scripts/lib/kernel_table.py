#!/usr/bin/env python3
"""The table of scripts/kernel-times.sh: per kernel, in launch order, its GPU time from ncu's CSV
(`--metrics gpu__time_duration.sum --csv`), for one build or two side by side, then the totals.

Usage: kernel_table.py NEW.csv [OLD.csv]
"""
import sys

from ncu_csv import metric_rows, short_kernel_name


def kernels(path):
    """[(short name, microseconds)] in launch order."""
    col, rows = metric_rows(path)
    to_us = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6,  # --print-units base
             "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
    out = []
    for r in rows:
        if r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        us = float(r[col["Metric Value"]].replace(",", "")) * to_us[r[col["Metric Unit"]]]
        out.append((short_kernel_name(r[col["Kernel Name"]])[-64:], us))
    return out


def main():
    new = kernels(sys.argv[1])
    old = kernels(sys.argv[2]) if len(sys.argv) > 2 else None
    if old is None:
        print(f"{'#':>4} {'us':>10}  kernel")
        for i, (name, us) in enumerate(new):
            print(f"{i:4d} {us:10.1f}  {name}")
        print(f"{'':4} {sum(us for _, us in new):10.1f}  total of {len(new)} kernels")
        return
    print(f"{'#':>4} {'old us':>10} {'new us':>10}  kernel")
    for i in range(max(len(new), len(old))):
        o = old[i] if i < len(old) else ("-", 0.0)
        n = new[i] if i < len(new) else ("-", 0.0)
        name = n[0] if n[0] == o[0] else f"{o[0]}  <>  {n[0]}"
        print(f"{i:4d} {o[1]:10.1f} {n[1]:10.1f}  {name}")
    print(f"{'':4} {sum(us for _, us in old):10.1f} {sum(us for _, us in new):10.1f}  "
          f"total of {len(old)} / {len(new)} kernels")


if __name__ == "__main__":
    main()
