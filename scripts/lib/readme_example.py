#!/usr/bin/env python3
"""Prints the README's code block marked `<!-- readme-example: NAME ... -->` (the first fenced block
after the marker), so a check runs the example exactly as the README writes it.

    python3 scripts/lib/readme_example.py transformers > example.py
Exit status 2 when README.md has no such marker or no fenced block after it."""
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example(name, text=None):
    lines = (README.read_text() if text is None else text).splitlines()
    marker = f"<!-- readme-example: {name}"
    start = next((i for i, line in enumerate(lines) if line.startswith(marker)), None)
    if start is None:
        raise LookupError(f"README.md has no '{marker} ...' marker")
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    end = None if fence is None else next((i for i in range(fence + 1, len(lines)) if lines[i].startswith("```")), None)
    if end is None:
        raise LookupError(f"README.md: no fenced code block after '{marker} ...'")
    return "\n".join(lines[fence + 1:end]) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: readme_example.py NAME")
    try:
        sys.stdout.write(readme_example(sys.argv[1]))
    except LookupError as e:
        print(f"readme_example: {e}", file=sys.stderr)
        sys.exit(2)
