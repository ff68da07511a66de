#!/usr/bin/env python3
"""The table of scripts/fused-fp8-ab.sh: per layer, the medians over the rounds of each path's FP8
pass (forward or backward) and fwd+bwd (caracal-bench --precision fp8: its "runs" time the FP8
layer), and each fused pass over the separate launches' same pass.

    fused_fp8_ab.py [--pass forward|backward] --old C --new C --md OUT.md --json OUT.json \
        LAYER:PATH:ROUND:BENCH_JSON...

PATH is separate (NEW's separate launches), old or new (that build's fused FP8 pass). A path
without runs shows "-" (old with OLD "-"), and so does a ratio without the separate launches' runs.
Exit status 1 when a bench JSON lacks the figures; 2 on bad arguments.
"""
import argparse
import json
import statistics
import sys

PATHS = ("separate", "old", "new")
FIGURES = ("forward", "backward", "fwd_bwd")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pass", dest="fused_pass", choices=("forward", "backward"), default="forward")
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    figures = {}  # layer -> path -> {"forward": [...], "backward": [...], "fwd_bwd": [...]}
    for run in a.runs:
        parts = run.split(":")
        if len(parts) < 6 or parts[3] not in PATHS:
            print(f"fused_fp8_ab: expected LAYER(model:experts:tokens):PATH:ROUND:JSON, got '{run}'", file=sys.stderr)
            return 2
        layer, path, path_json = ":".join(parts[:3]), parts[3], ":".join(parts[5:])
        try:
            with open(path_json) as f:
                r = json.load(f)["runs"][0]
            values = {what: float(r[what]["ms"]) for what in FIGURES}
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"fused_fp8_ab: {path_json}: no FP8 forward, backward and fwd+bwd ms ({e!r})", file=sys.stderr)
            return 1
        by_path = figures.setdefault(layer, {}).setdefault(path, {what: [] for what in FIGURES})
        for what in FIGURES:
            by_path[what].append(values[what])

    def median(layer, path, what):
        runs = figures[layer].get(path, {}).get(what, [])
        return statistics.median(runs) if runs else None

    def ms(v):
        return "-" if v is None else f"{v:.3f}"

    def ratio(v, base):
        return "-" if v is None or not base else f"{v / base:.3f}"

    p = a.fused_pass
    rows, out = [], {"pass": p, "old": a.old, "new": a.new, "layers": {}}
    for layer in figures:
        sep = median(layer, "separate", p)
        m = {path: (median(layer, path, p), median(layer, path, "fwd_bwd")) for path in PATHS}
        rows.append(f"| {layer} | {ms(m['separate'][0])} | {ms(m['old'][0])} ({ratio(m['old'][0], sep)}) | "
                    f"{ms(m['new'][0])} ({ratio(m['new'][0], sep)}) | {ms(m['separate'][1])} / {ms(m['old'][1])} / "
                    f"{ms(m['new'][1])} |")
        out["layers"][layer] = {
            path: dict({f"{what}_ms": figures[layer].get(path, {}).get(what, []) for what in FIGURES},
                       **{f"{what}_median_ms": median(layer, path, what) for what in FIGURES})
            for path in PATHS}
    md = [f"FP8 {p} at W = 1, ms (median of rounds; in brackets over the separate launches): "
          f"old {a.old}, new {a.new}", "",
          "| layer | separate launches | old fused | new fused | fwd+bwd: separate / old / new |",
          "|---|---|---|---|---|"] + rows
    with open(a.md, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
