#!/usr/bin/env python3
"""The comparison of scripts/sass-identity.sh: two folders of `cuobjdump --dump-sass
--dump-resource-usage` dumps, one file LIB.sass per kernel library, compared kernel by kernel.

A kernel (any `Function :` of the dump) is its SASS lines and its resource-usage line. What a
rename changes, and only that, is normalized: the function's own name (it is the key, not part of
the body) and mangled names (`_Z...`) inside the body, as call targets and relocations carry them,
each replaced by its order of first appearance in the kernel. Registers, instructions, their order,
constants, branch offsets and encodings are compared as they are.

Kernels pair up per library: first by name (within the same archive member), then, among those
left, by normalized body, so that a kernel renamed with the same code pairs up; then, renamed and
changed, the one kernel left on each side of an archive member. A pair whose bodies differ
"differs"; a kernel left unpaired is only in OLD or only in NEW.

Usage: sass_identity.py OLD_DIR NEW_DIR VERDICT_TSV
Prints the report; writes VERDICT_TSV, one line a result: `identical<TAB>LIB<TAB>N<TAB>RENAMED<TAB>
KERNELS` per library (N of its KERNELS identical, RENAMED of them renamed), `differs|only in OLD|only in NEW<TAB>LIB<TAB>KERNEL` per failure (KERNEL demangled,
without its parameters).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys

MANGLED = re.compile(r"_Z[A-Za-z0-9_$]+")


class Kernel:
    def __init__(self, member, name):
        self.member = member
        self.name = name
        self.lines = []
        self.resources = ""

    def body(self):
        """The normalized text compared: resource usage, then the SASS lines."""
        seen = {}

        def placeholder(m):
            return seen.setdefault(m.group(0), f"<sym{len(seen)}>")

        lines = [MANGLED.sub(placeholder, line.rstrip()) for line in self.lines]
        while lines and not lines[-1]:
            lines.pop()
        return [f"resources: {self.resources}"] + lines

    def digest(self):
        return hashlib.sha256("\n".join(self.body()).encode()).hexdigest()


def parse(path):
    """The kernels of one dump, in order."""
    kernels, resources = [], {}
    member, current, pending = "", None, None
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        stripped = line.strip()
        if line.startswith("member "):
            member = stripped[len("member "):].rstrip(":").rsplit(":", 1)[-1]
            current = None
        elif stripped.startswith("Function : "):
            current = Kernel(member, stripped[len("Function : "):])
            kernels.append(current)
        elif stripped.startswith("Function ") and stripped.endswith(":"):
            pending = (member, stripped[len("Function "):-1])
        elif pending is not None and stripped.startswith("REG:"):
            resources[pending] = stripped
            pending = None
        elif stripped == "Fatbin elf code:":
            current = None
        elif current is not None:
            current.lines.append(line)
    for k in kernels:
        k.resources = resources.get((k.member, k.name), "")
    return kernels


def demangled(names):
    """Readable names (c++filt where there is one), without the parameter list."""
    names = list(names)
    tool = shutil.which("c++filt")
    out = names
    if tool and names:
        run = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
        if run.returncode == 0 and len(run.stdout.splitlines()) == len(names):
            out = run.stdout.splitlines()
    short = {}
    for name, text in zip(names, out):
        if text.endswith(")"):  # drop the parameters: the last top-level parenthesis
            depth = 0
            for i in range(len(text) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(text[i], 0)
                if depth == 0:
                    text = text[:i]
                    break
        short[name] = text[5:] if text.startswith("void ") else text
    return short


def first_difference(old, new):
    a, b = old.body(), new.body()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "<end>"
        y = b[i] if i < len(b) else "<end>"
        if x != y:
            return f"line {i}: {' '.join(x.split())}  |  {' '.join(y.split())}"
    return ""


def compare(lib, old, new, verdicts):
    """Pairs and compares one library's kernels; the number of identical pairs."""
    names = demangled({k.name for k in old + new})
    left_new = {}
    for k in new:
        left_new.setdefault((k.member, k.name), []).append(k)
    identical, renamed, unpaired_old = 0, 0, []
    for k in old:
        same_name = left_new.get((k.member, k.name))
        if not same_name:
            unpaired_old.append(k)
            continue
        other = same_name.pop(0)
        if k.digest() == other.digest():
            identical += 1
        else:
            print(f"  differs: {names[k.name]} ({k.member})\n    {first_difference(k, other)}")
            verdicts.append(("differs", lib, names[k.name]))
    by_body = {}
    for ks in left_new.values():
        for k in ks:
            by_body.setdefault(k.digest(), []).append(k)
    still_old = []
    for k in unpaired_old:
        match = by_body.get(k.digest())
        if match:
            other = match.pop(0)
            identical += 1
            renamed += 1
            print(f"  renamed, same code: {names[k.name]}\n                   -> {names[other.name]}")
        else:
            still_old.append(k)
    still_new = [k for ks in by_body.values() for k in ks]
    # Renamed and changed: the one kernel left on each side of an archive member pair up.
    for k in still_old:
        in_old = [o for o in still_old if o.member == k.member]
        in_new = [n for n in still_new if n.member == k.member]
        if len(in_old) == 1 and len(in_new) == 1:
            other = in_new[0]
            still_new.remove(other)
            print(f"  differs: {names[k.name]} ({k.member})\n       -> {names[other.name]}\n"
                  f"    {first_difference(k, other)}")
            verdicts.append(("differs", lib, names[k.name]))
        else:
            print(f"  only in OLD: {names[k.name]} ({k.member})")
            verdicts.append(("only in OLD", lib, names[k.name]))
    for k in still_new:
        print(f"  only in NEW: {names[k.name]} ({k.member})")
        verdicts.append(("only in NEW", lib, names[k.name]))
    return identical, renamed


def main():
    old_dir, new_dir, verdict_path = sys.argv[1:4]
    verdicts = []
    for name in sorted(os.listdir(old_dir)):
        if not name.endswith(".sass"):
            continue
        lib = name[: -len(".sass")]
        old = parse(os.path.join(old_dir, name))
        new = parse(os.path.join(new_dir, name)) if os.path.exists(os.path.join(new_dir, name)) else []
        print(f"{lib}: {len(old)} kernels in OLD, {len(new)} in NEW")
        identical, renamed = compare(lib, old, new, verdicts)
        verdicts.append(("identical", lib, str(identical), str(renamed), str(max(len(old), len(new)))))
    with open(verdict_path, "w") as f:
        for v in verdicts:
            f.write("\t".join(v) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
