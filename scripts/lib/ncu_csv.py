"""Reading ncu's CSV (`--csv --print-units base`), shared by kernel_table.py and profile_digest.py."""
import csv
import re


def metric_rows(path):
    """(column index by name, data rows) of the CSV at `path`; ({}, []) when it holds none (ncu's
    own lines, which have fewer columns, are skipped)."""
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 5]
    if not rows:
        return {}, []
    return {name: i for i, name in enumerate(rows[0])}, rows[1:]


def short_kernel_name(name):
    """A kernel's name without its parameter list, `void` and anonymous namespaces."""
    name = re.sub(r"\(.*$", "", name)
    return re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
