#!/usr/bin/env python3
"""Plot a `caracal bench --sweep ... --json SWEEP.json` run: TFLOP/s and ms against tokens per rank
for forward, backward and forward+backward (ours), with the cuBLAS dense baseline of equal FLOPs
dashed.

Usage: python3 bench/python/plot_sweep.py SWEEP.json [-o sweep.png]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on the GPU machine
import matplotlib.pyplot as plt  # noqa: E402

PASSES = (("forward", "forward", "forward_ms"), ("backward", "backward", "backward_ms"),
          ("fwd_bwd", "forward+backward", "fwd_bwd_ms"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_json", help="written by caracal bench --sweep ... --json")
    parser.add_argument("-o", "--output", default="sweep.png", help="PNG to write")
    args = parser.parse_args()
    with open(args.sweep_json) as f:
        data = json.load(f)
    runs = sorted(data.get("runs", []), key=lambda r: r["tokens_per_rank"])
    if not runs:
        sys.exit(f"plot_sweep.py: error: no runs in {args.sweep_json}")
    tokens = [r["tokens_per_rank"] for r in runs]

    fig, (ax_tf, ax_ms) = plt.subplots(1, 2, figsize=(13, 5))
    colors = {"forward": "tab:blue", "backward": "tab:orange", "fwd_bwd": "tab:green"}
    for key, label, baseline_key in PASSES:
        ours_tf = [r[key]["tflops"] for r in runs]
        ours_ms = [r[key]["ms"] for r in runs]
        ax_tf.plot(tokens, ours_tf, "o-", color=colors[key], label=f"Caracal {label}")
        ax_ms.plot(tokens, ours_ms, "o-", color=colors[key], label=f"Caracal {label}")
        cublas = [r.get("baselines", {}).get("cublas_dense", {}) for r in runs]
        if all(b.get("available") for b in cublas):
            cublas_ms = [b[baseline_key] for b in cublas]
            # Equal FLOPs: the baseline's rate is ours scaled by the time ratio.
            cublas_tf = [tf * ms / b_ms for tf, ms, b_ms in zip(ours_tf, ours_ms, cublas_ms)]
            ax_tf.plot(tokens, cublas_tf, "s--", color=colors[key], alpha=0.5, label=f"cuBLAS dense {label}")
            ax_ms.plot(tokens, cublas_ms, "s--", color=colors[key], alpha=0.5, label=f"cuBLAS dense {label}")

    layer = data.get("layer", {})
    title = (f"{data.get('model') or 'custom'}: D={layer.get('hidden')} I={layer.get('intermediate')} "
             f"E={layer.get('experts')} ({layer.get('local_experts')} per rank) k={layer.get('top_k')}, "
             f"EP={data.get('ep')} {data.get('backend')}, {data.get('routing')}, {data.get('device', {}).get('name', '')}")
    for ax, ylabel in ((ax_tf, "TFLOP/s per GPU"), (ax_ms, "ms (median)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(tokens)
        ax.set_xticklabels([str(t) for t in tokens])
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_ms.set_yscale("log")
    ax_tf.set_ylim(bottom=0)
    ax_tf.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_sweep.py: wrote {args.output}")


if __name__ == "__main__":
    main()
