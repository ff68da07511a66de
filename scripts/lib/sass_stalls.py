"""Digest of ncu's SASS source page (`ncu -i REP --page source --csv --print-source sass`): the stall
reasons summed over the kernel, and the instructions holding the most warp samples with their top
reasons. Usage: sass_stalls.py SASS_CSV [instructions]"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 3]
    if not rows:
        print(f"sass_stalls: no CSV rows in {path}")
        return 1
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    source = col.get("Source")
    samples = next((i for name, i in col.items() if name.startswith("Warp Stall Sampling (All")), None)
    # ncu gives each reason twice: all samples, and "(Not Issued)" ones; the first is kept.
    reasons = {name: i for name, i in col.items() if name.lower().startswith("stall_") and "Not Issued" not in name}
    if source is None or samples is None:
        print("sass_stalls: columns not recognized; header:", header)
        return 1
    total = sum(number(r[samples]) for r in body)
    print(f"warp samples: {total:.0f} over {len(body)} SASS instructions")
    if reasons:
        sums = sorted(((sum(number(r[i]) for r in body), name) for name, i in reasons.items()), reverse=True)
        print("by reason:", ", ".join(f"{name[6:]} {100 * s / max(total, 1):.1f}%" for s, name in sums if s > 0))
    ranked = sorted(range(len(body)), key=lambda k: -number(body[k][samples]))[:top]
    for k in sorted(ranked):
        r = body[k]
        share = 100 * number(r[samples]) / max(total, 1)
        why = sorted(((number(r[i]), name[6:]) for name, i in reasons.items()), reverse=True)[:2]
        why_text = ", ".join(f"{name} {v:.0f}" for v, name in why if v > 0)
        print(f"  {k:6d} {number(r[samples]):8.0f} {share:5.1f}%  {r[source].strip()[:70]:70s} {why_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
