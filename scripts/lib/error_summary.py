#!/usr/bin/env python3
"""The largest numeric errors the GPU test logs report, per output: where the tests' bounds come
from (about 3x these; bench/baselines/output_error.hpp, bench/baselines/layer_bounds.hpp).

Reads lines "  error <name>: frobenius X, worst row Y" (the layer suites), "  <name>: relative
Frobenius error X" (the grouped-GEMM suites) and "  error d_topk_scores: frobenius X, worst |error|
/ B_t Y". Names lose their "rank N " prefix and " of expert N" / "(worst expert)" suffixes.
d_topk_scores is bounded per element against B_t, a bound on the token's |dg| (the reference may
cancel to ~0, where a relative Frobenius error means nothing): its line gives that measure.

Usage: error_summary.py LOG...   prints one line per output: worst frobenius, worst row (or
worst |error| / B_t).
"""
import re
import sys

LAYER = re.compile(r"^\s+error (?:rank \d+ )?(.+?): frobenius ([0-9.eE+-]+|inf|nan), worst (row|\|error\| / B_t) ([0-9.eE+-]+|inf|nan)")
GEMM = re.compile(r"^\s+(\w[\w ]*?)(?: of expert \d+)?: relative Frobenius error ([0-9.eE+-]+)")


def main():
    worst = {}
    per_bound = set()  # outputs measured against B_t rather than by rows
    for path in sys.argv[1:]:
        suite = path.rsplit("/", 1)[-1].split(".")[0]
        with open(path, errors="replace") as f:
            for line in f:
                m = LAYER.match(line)
                if m:
                    key, frob, row = f"{suite}: {m.group(1)}", float(m.group(2)), float(m.group(4))
                    if m.group(3) != "row":
                        per_bound.add(key)
                else:
                    m = GEMM.match(line)
                    if not m:
                        continue
                    key, frob, row = f"{suite}: {m.group(1)}", float(m.group(2)), 0.0
                f0, r0 = worst.get(key, (0.0, 0.0))
                worst[key] = (max(f0, frob), max(r0, row))
    for key in sorted(worst):
        frob, row = worst[key]
        if key in per_bound:
            print(f"{key:60s} worst |error| / B_t {row:.3e} (per element; no Frobenius bound)")
        else:
            print(f"{key:60s} frobenius {frob:.3e}  worst row {row:.3e}")


if __name__ == "__main__":
    main()
