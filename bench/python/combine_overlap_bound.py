#!/usr/bin/env python3
"""How much of the forward's combine a fused launch could hide at W = 1 (issue 49's forward target,
fused forward <= 1.06x its GEMMs alone): arithmetic over a simulated routing, not a measurement.

At W = 1 the fused forward (src/fused/forward_tasks.cuh) runs every expert's up/gate tiles, then
every expert's down tiles expert by expert (RowTileScheduler's order: an expert's 128-row blocks
in order), then the combine launch sums each token's k expert outputs. A token could be combined
once the last of its k rows' down tiles is done. Modelled: the down phase is the launch's last
`--down-share` of its time, each expert an equal part of it, each of its row blocks an equal part
of the expert's (rows in token order within an expert, uniform top-k routing), so a token is ready
when the latest of its rows' blocks is. A combine running beside the tiles at a share `s` of the
rate the standalone combine kernel reaches takes tokens as they become ready; what is left when the
launch ends runs at the full rate. Printed: the share of tokens ready at points of the launch, the
tail past the launch and the forward's floor over its GEMMs alone, (schedule + launch + tail) /
GEMMs alone, for each share, beside today's (schedule + launch + the whole combine). The launch is
taken as the GEMMs alone (measured so on an H200: the fused forward launch 1,047 us against v1's
up/gate + down 1,046, E128 T8192) and the combine beside it as free to the tiles (optimistic: it
needs HBM bandwidth the tiles leave idle; the down phase moves ~2 TB/s of the H200's 4.8).

    python3 bench/python/combine_overlap_bound.py [--experts 128] [--top-k 8] [--tokens 8192]
        [--gemms-ms 1.046] [--down-share 0.36] [--combine-ms 0.0876] [--schedule-ms 0.0253]
        [--shares 0.25,0.5,1] [--order phases|experts] [--down-passes 1] [--tail-share 1]

Defaults: Qwen3-30B-A3B with 128 experts on one H200 (ncu kernel times, 2026-12-05, ce8de61:
docs/results/2026-12-05-fused-vs-v1-h200-ce8de61.txt; the down share is v1's down kernel over its
up/gate + down).
"""
import argparse
import random


def ready_fractions(experts, top_k, tokens, down_share, seed, order="phases", block_rows=128, down_passes=1):
    """Each token's ready time as a fraction of the launch: when the down tile of the latest of its k
    rows' blocks ends (rows in token order within an expert, uniform top-k routing). order "phases":
    every up/gate tile, then the down tiles expert by expert (today's); "experts": each expert's
    up/gate tiles then its down tiles, expert by expert. With "phases", `down_passes` > 1 walks the
    down tiles in that many passes over the experts, pass p taking the p-th share of each expert's
    row blocks (the low-index tokens, first in every expert's rows, complete early; every pass reads
    every expert's weights again)."""
    rng = random.Random(seed)
    routes = [rng.sample(range(experts), top_k) for _ in range(tokens)]
    rows_of = [[] for _ in range(experts)]  # each expert's tokens in token order
    for t, chosen in enumerate(routes):
        for e in chosen:
            rows_of[e].append(t)
    ready = [0.0] * tokens
    up_share = 1.0 - down_share
    # The down tiles' order: (pass, expert, block), pass = the block's share of its expert's blocks.
    blocks_of = [max(1, -(-len(rows) // block_rows)) for rows in rows_of]
    order_key = sorted((j * down_passes // blocks_of[e], e, j) for e in range(experts) for j in range(blocks_of[e]))
    position = {(e, j): i for i, (_, e, j) in enumerate(order_key)}
    for e, rows in enumerate(rows_of):
        blocks = max(1, -(-len(rows) // block_rows))
        for i, t in enumerate(rows):
            within = (i // block_rows + 1) / blocks  # of the expert's down tiles
            if order == "phases":
                done = up_share + down_share * (position[(e, i // block_rows)] + 1) / len(position)
            else:
                done = (e + up_share + down_share * within) / experts
            ready[t] = max(ready[t], done)
    return sorted(ready)


def tail_after_launch(ready, launch, combine, share, tail_share=1.0):
    """Time past the launch's end the combine still needs, tokens taken in ready order at `share` of
    the full rate until the launch ends and at `tail_share` of it after (1: the whole CTA's threads
    sum once the tiles are done; the summing warps alone keep their own rate)."""
    per_token = combine / len(ready)
    now = 0.0
    for r in ready:
        now = max(now, r * launch)
        if now < launch:  # beside the tiles, at `share` of the rate, until the launch ends
            during = min(per_token / share, launch - now)
            now += during
            left = per_token - during * share
            now += left / tail_share  # any remainder after the launch
        else:
            now += per_token / tail_share
    return max(0.0, now - launch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--gemms-ms", type=float, default=1.046)
    parser.add_argument("--down-share", type=float, default=0.36)
    parser.add_argument("--combine-ms", type=float, default=0.0876)
    parser.add_argument("--schedule-ms", type=float, default=0.0253)
    parser.add_argument("--shares", default="0.25,0.5,1")
    parser.add_argument("--order", choices=("phases", "experts"), default="phases",
                        help="the launch's tile order: phases (every up/gate tile, then the down tiles: today's) "
                             "or experts (each expert's up/gate, then its down tiles)")
    parser.add_argument("--down-passes", type=int, default=1,
                        help="with --order phases, the down tiles in this many passes over the experts, each "
                             "taking the next share of every expert's row blocks (1: expert by expert, today's)")
    parser.add_argument("--hidden", type=int, default=2048, help="D (for the weights each extra pass reads again)")
    parser.add_argument("--intermediate", type=int, default=768, help="I (likewise)")
    parser.add_argument("--tail-share", type=float, default=1.0,
                        help="the combine's rate after the launch's last tile, as a share of the standalone "
                             "combine's (1: every thread of the CTAs sums then; the token sums of 2026-12-06 kept "
                             "their three warps a CTA, about the beside-the-tiles share)")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",") if s]
    if not 0 < args.top_k <= args.experts or args.tokens < 1 or args.gemms_ms <= 0 or args.combine_ms < 0 \
            or not 0 < args.down_share <= 1 or any(not 0 < s <= 1 for s in shares) \
            or not 0 < args.tail_share <= 1 or args.down_passes < 1 \
            or (args.down_passes > 1 and args.order != "phases"):
        parser.error("need 0 < --top-k <= --experts, --tokens >= 1, --gemms-ms > 0, --combine-ms >= 0, "
                     "--down-share, --tail-share and every share in (0, 1], --down-passes >= 1 (above 1 with "
                     "--order phases)")
    ready = ready_fractions(args.experts, args.top_k, args.tokens, args.down_share, args.seed, args.order,
                            down_passes=args.down_passes)
    g, c, s = args.gemms_ms, args.combine_ms, args.schedule_ms
    passes = f", {args.down_passes} down passes" if args.down_passes > 1 else ""
    print(f"E {args.experts}, top-{args.top_k}, T {args.tokens}, tile order {args.order}{passes}: GEMMs alone {g:.3f} ms, "
          f"combine {c:.4f} ms, schedule {s:.4f} ms")
    if args.down_passes > 1:
        extra = (args.down_passes - 1) * args.experts * args.hidden * args.intermediate * 2
        print(f"  the down weights read {args.down_passes} times: {extra / 1e6:.0f} MB more from HBM "
              f"(not modelled in the times below)")
    for f in (0.7, 0.8, 0.9, 0.95):
        print(f"  tokens ready by {f:.0%} of the launch: {sum(r <= f for r in ready) / len(ready):6.1%}")
    print(f"  combine after the launch (today): forward / GEMMs alone >= {(s + g + c) / g:.3f}")
    for share in shares:
        tail = tail_after_launch(ready, g, c, share, args.tail_share)
        print(f"  combine beside the tiles at {share:4.0%} of its rate, {args.tail_share:4.0%} after them: tail "
              f"{1e3 * tail:6.1f} us, forward >= {s + g + tail:.3f} ms, / GEMMs alone >= {(s + g + tail) / g:.3f}")


if __name__ == "__main__":
    main()
