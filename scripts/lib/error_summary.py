#!/usr/bin/env python3
"""The largest numeric errors the GPU test logs report, per output: where the tests' bounds come
from (about 3x these; tests/gpu/output_checks.hpp).

Reads lines "  error <name>: frobenius X, worst row Y" (the layer suites), "  <name>: relative
Frobenius error X" (the grouped-GEMM suites) and "  error d_topk_scores: frobenius X, worst |error|
/ B_t Y". Names lose their "rank N " prefix and " of expert N" / "(worst expert)" suffixes.

Usage: error_summary.py LOG...   prints one line per output: worst frobenius, worst row.
"""
import re
import sys

LAYER = re.compile(r"^\s+error (?:rank \d+ )?(.+?): frobenius ([0-9.eE+-]+|inf|nan), worst (?:row|\|error\| / B_t) ([0-9.eE+-]+|inf|nan)")
GEMM = re.compile(r"^\s+(\w[\w ]*?)(?: of expert \d+)?: relative Frobenius error ([0-9.eE+-]+)")


def main():
    worst = {}
    for path in sys.argv[1:]:
        suite = path.rsplit("/", 1)[-1].split(".")[0]
        with open(path, errors="replace") as f:
            for line in f:
                m = LAYER.match(line)
                if m:
                    key, frob, row = f"{suite}: {m.group(1)}", float(m.group(2)), float(m.group(3))
                else:
                    m = GEMM.match(line)
                    if not m:
                        continue
                    key, frob, row = f"{suite}: {m.group(1)}", float(m.group(2)), 0.0
                f0, r0 = worst.get(key, (0.0, 0.0))
                worst[key] = (max(f0, frob), max(r0, row))
    for key in sorted(worst):
        frob, row = worst[key]
        print(f"{key:60s} frobenius {frob:.3e}  worst row {row:.3e}")


if __name__ == "__main__":
    main()
