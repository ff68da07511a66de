#!/usr/bin/env python3
"""Sorts the errors of a compute-sanitizer log into Caracal's and NCCL's own.

NCCL probes its kernel images and device features when it starts (peer access already enabled,
cuMemCreate not permitted, ...), and memcheck reports each failed probe as an API error. Those are
NCCL's business; an error in Caracal's calls or kernels is ours and fails the check. An error is
NCCL's when its host backtrace runs through libnccl or it sits in an NCCL kernel (nccl*).

Usage: sanitizer_report.py LOG   prints "ours N, nccl M" (and our first error), exit 1 if N > 0.
"""
import re
import sys


def blocks(lines):
    """The error reports of a log: each starts at a '========= <message>' line that is not a frame."""
    block = []
    for line in lines:
        if not line.startswith("========="):
            continue
        body = line[len("========="):].strip()
        if not body:
            if block:
                yield block
            block = []
            continue
        if body.startswith(("ERROR SUMMARY", "RACECHECK SUMMARY", "COMPUTE-SANITIZER", "LEAK SUMMARY")):
            if block:
                yield block
            block = []
            continue
        if not line.startswith("=========  ") and block:  # a new message while one is open
            yield block
            block = []
        block.append(body)
    if block:
        yield block


def is_nccl(block):
    text = "\n".join(block)
    return bool(re.search(r"libnccl\.so|in (?:void )?nccl\w*(?:Kernel|Dev)", text))


def main():
    with open(sys.argv[1], errors="replace") as f:
        found = list(blocks(f))
    ours = [b for b in found if not is_nccl(b)]
    nccl = len(found) - len(ours)
    line = f"ours {len(ours)}, nccl {nccl}"
    if ours:
        line += " -- first of ours: " + ours[0][0][:200]
    print(line)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
