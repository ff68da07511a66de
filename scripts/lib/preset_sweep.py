#!/usr/bin/env python3
"""The rows and the report of scripts/preset-sweep.sh (issue 49).

  preset_sweep.py rows MODELS.json
      The preset rows from `caracal models --json`, one a line: NAME<TAB>run<TAB>ARGS for a preset
      the layer runs, its experts cut to an EP8 slice (E/8 local experts, W = 1, T = 4096:
      docs/PERF.md's runs; every preset's E is a multiple of 8, tests/unit/test_presets.cpp), or
      NAME<TAB>refused<TAB>REASON for one plan and bench refuse.
  preset_sweep.py report MANIFEST OUT_DIR [--commit C] [--gpu G] [--rounds N] [--reps N]
                         [--warmup N] [--quick] [--max-fused-over-v1 X] [--max-over-gemms X]
      MANIFEST: one line a row, NAME<TAB>STATUS<TAB>SECONDS<TAB>JSON<TAB>ARGS, STATUS "ok" (JSON is
      caracal-bench's), "refused: why", or what failed. Prints the table (markdown, for
      docs/PERF.md) and writes OUT_DIR/preset-sweep.md (the same), OUT_DIR/preset-sweep.json (every
      row, its figures, verdict and its bench's whole JSON; for docs/results/) and
      OUT_DIR/verdicts.tsv (NAME<TAB>VERDICT<TAB>TEXT, a line a row in order; VERDICT PASS,
      REFUSED, MISS or FAILED; TEXT with the bench's seconds where it ran). Where a row's bench ran
      under scripts/clock-trace.py (OUT_DIR/clock_<row>.json beside bench_<row>.json), a second
      table gives each path's SM clock, power and clock-event reasons during its fwd+bwd replays.

A row that ran PASSes when every target holds on its medians of rounds: fused fwd+bwd / v1's
<= --max-fused-over-v1 (1.00: never slower), forward and backward / their GEMMs alone <=
--max-over-gemms (1.06). It is a MISS when one does not, or cannot be checked (v1 or the GEMMs
alone not run).
"""
import argparse
import datetime
import json
import os
import statistics
import sys

TOKENS = 4096
EP8 = 8


def preset_rows(models_path):
    with open(models_path) as f:
        presets = json.load(f)["presets"]
    lines = []
    for p in presets:
        if not p["supported"]:
            lines.append(f"{p['name']}\trefused\t{p['unsupported']}")
            continue
        if p["experts"] % EP8:
            raise ValueError(f"preset {p['name']}: {p['experts']} experts is not a multiple of {EP8}")
        local = p["experts"] // EP8
        lines.append(f"{p['name']} E{local} T{TOKENS}\trun\t--model {p['name']} --experts {local} --tokens {TOKENS}")
    return lines


def figures(bench):
    """The row's figures from caracal-bench's JSON (its one run), and what could not be read."""
    run = bench["runs"][0]
    gemms = run["baselines"]["nccl_exchange_plus_gemms"]
    cublas = run["baselines"]["cublas_dense"]
    layer = bench.get("layer", {})
    f = {"hidden": layer.get("hidden"), "intermediate": layer.get("intermediate"), "top_k": layer.get("top_k"),
         "shared_intermediate": layer.get("shared_intermediate"), "local_experts": layer.get("local_experts"),
         "tokens_per_rank": run.get("tokens_per_rank"), "fused_fwd_bwd_ms": run["fwd_bwd"]["ms"]}
    gaps = []
    if "forward_over_gemms_alone" in gemms:
        f["forward_over_gemms_alone"] = gemms["forward_over_gemms_alone"]
        f["backward_over_gemms_alone"] = gemms["backward_over_gemms_alone"]
    else:
        gaps.append("GEMMs alone not run: " + str(gemms.get("note", "?")))
    f["fused_forward_ms"], f["fused_backward_ms"] = run["forward"]["ms"], run["backward"]["ms"]
    # A step over its two passes timed apart: above 1, the passes cost more back to back in one step.
    f["fused_step_over_passes"] = f["fused_fwd_bwd_ms"] / (f["fused_forward_ms"] + f["fused_backward_ms"])
    v1 = run.get("v1", {})
    for pass_name in ("forward", "backward"):  # each pass timed apart (v1's backward: benches since 2026-12-05)
        if pass_name in v1:
            f[f"v1_{pass_name}_ms"] = v1[pass_name]["ms"]
            f[f"{pass_name}_fused_over_v1"] = f[f"fused_{pass_name}_ms"] / f[f"v1_{pass_name}_ms"]
    if "fwd_bwd" in v1:
        f["v1_fwd_bwd_ms"] = v1["fwd_bwd"]["ms"]
        f["fused_over_v1"] = f["fused_fwd_bwd_ms"] / f["v1_fwd_bwd_ms"]
        if "v1_forward_ms" in f and "v1_backward_ms" in f:
            f["v1_step_over_passes"] = f["v1_fwd_bwd_ms"] / (f["v1_forward_ms"] + f["v1_backward_ms"])
    else:
        gaps.append("v1 not run: " + str(v1.get("skipped", "?")))
    if cublas.get("available"):
        f["cublas_fwd_bwd_ms"] = cublas["fwd_bwd_ms"]
        f["cublas_over_fused"] = cublas["fwd_bwd_ms"] / f["fused_fwd_bwd_ms"]
        if "v1_fwd_bwd_ms" in f:
            f["cublas_over_v1"] = cublas["fwd_bwd_ms"] / f["v1_fwd_bwd_ms"]
    return f, gaps


def misses(f, gaps, max_v1, max_gemms):
    out = list(gaps)
    if "fused_over_v1" in f and f["fused_over_v1"] > max_v1:
        out.append(f"fused/v1 {f['fused_over_v1']:.3f} > {max_v1:.2f}")
    for pass_name, key in (("fwd", "forward_over_gemms_alone"), ("bwd", "backward_over_gemms_alone")):
        if key in f and f[key] > max_gemms:
            out.append(f"{pass_name}/GEMMs {f[key]:.3f} > {max_gemms:.2f}")
    return out


def clocks(trace):
    """From scripts/clock-trace.py's JSON of a row's bench: per path (fused, v1), the medians over the
    rounds of its fwd+bwd phases' SM clock (MHz) and mean power (W), and the clock-event reasons
    seen in them (their largest share of a phase's busy samples)."""
    out = {}
    for path, marker in (("fused", "(fused forward): forward+backward"), ("v1", "(v1 forward): forward+backward")):
        phases = [p for p in trace["phases"] if p["phase"].endswith(marker) and p.get("busy_samples")]
        if not phases:
            continue
        out[f"{path}_fwd_bwd_sm_mhz"] = statistics.median(p["sm_mhz_median"] for p in phases)
        out[f"{path}_fwd_bwd_watts"] = statistics.median(p["watts_mean"] for p in phases)
        reasons = {}
        for p in phases:
            for reason, share in p["reasons"].items():
                reasons[reason] = max(reasons.get(reason, 0.0), share)
        out[f"{path}_fwd_bwd_reasons"] = reasons
    return out


def clock_table(rows):
    """The rows' clocks during the fwd+bwd replays (markdown), or '' when no row has them."""
    traced = [r for r in rows if "fused_fwd_bwd_sm_mhz" in r or "v1_fwd_bwd_sm_mhz" in r]
    if not traced:
        return ""
    lines = ["| shape | SM MHz f+b, fused / v1 | W f+b, fused / v1 | clock-event reasons, fused / v1 |",
             "|---|---|---|---|"]
    for r in traced:
        def reasons(path):
            seen = r.get(f"{path}_fwd_bwd_reasons", {})
            return ", ".join(f"{k} {v:.0%}" for k, v in seen.items()) or "none"
        lines.append(f"| {r['name']} | {cell(r, 'fused_fwd_bwd_sm_mhz', '.0f')} / {cell(r, 'v1_fwd_bwd_sm_mhz', '.0f')} "
                     f"| {cell(r, 'fused_fwd_bwd_watts', '.0f')} / {cell(r, 'v1_fwd_bwd_watts', '.0f')} "
                     f"| {reasons('fused')} / {reasons('v1')} |")
    return "\n".join(lines)


def read_manifest(path):
    rows = []
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            name, status, seconds, json_path, args = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
            rows.append({"name": name, "status": status, "seconds": int(seconds or 0), "json": json_path,
                         "args": args})
    return rows


def judge(row, max_v1, max_gemms):
    """Fills in the row's verdict, text and figures (and its bench JSON)."""
    status = row["status"]
    if status.startswith("refused"):
        row["verdict"], row["text"] = "REFUSED", status
        return
    if status != "ok":
        row["verdict"], row["text"] = "FAILED", status
        return
    try:
        with open(row["json"]) as fh:
            bench = json.load(fh)
        f, gaps = figures(bench)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        row["verdict"], row["text"] = "FAILED", f"its JSON ({row['json']}) is unreadable: {type(e).__name__}: {e}"
        return
    row.update(f)
    row["bench"] = bench
    folder, name = os.path.split(row["json"])
    trace_path = os.path.join(folder, "clock_" + name[len("bench_"):]) if name.startswith("bench_") else ""
    if trace_path and os.path.exists(trace_path):  # CLOCK_TRACE=1 (scripts/clock-trace.py)
        try:
            with open(trace_path) as fh:
                row.update(clocks(json.load(fh)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            row["clock_trace_error"] = f"{type(e).__name__}: {e}"
    row["misses"] = misses(f, gaps, max_v1, max_gemms)
    row["verdict"] = "MISS" if row["misses"] else "PASS"
    row["text"] = "MISS: " + "; ".join(row["misses"]) if row["misses"] else "PASS"


def cell(row, key, fmt):
    return format(row[key], fmt) if key in row else "-"


def table(rows, max_v1, max_gemms):
    head = ("| shape | D / I / k / shared I | fwd / GEMMs alone | bwd / GEMMs alone | fused f+b ms | v1 f+b ms "
            "| fused / v1 | fwd, bwd fused / v1 | f+b / (fwd + bwd), fused, v1 | cuBLAS / fused | cuBLAS / v1 | target |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        dims = (f"{r['hidden']} / {r['intermediate']} / {r['top_k']} / {r['shared_intermediate']}"
                if "hidden" in r else "-")
        lines.append(f"| {r['name']} | {dims} | {cell(r, 'forward_over_gemms_alone', '.3f')} "
                     f"| {cell(r, 'backward_over_gemms_alone', '.3f')} | {cell(r, 'fused_fwd_bwd_ms', '.3f')} "
                     f"| {cell(r, 'v1_fwd_bwd_ms', '.3f')} | {cell(r, 'fused_over_v1', '.3f')} "
                     f"| {cell(r, 'forward_fused_over_v1', '.3f')}, {cell(r, 'backward_fused_over_v1', '.3f')} "
                     f"| {cell(r, 'fused_step_over_passes', '.3f')}, {cell(r, 'v1_step_over_passes', '.3f')} "
                     f"| {cell(r, 'cublas_over_fused', '.2f')} | {cell(r, 'cublas_over_v1', '.2f')} | {r['text']} |")
    lines.append("")
    lines.append(f"Targets (issue 49): fused fwd+bwd / v1's <= {max_v1:.2f}, forward and backward / their GEMMs "
                 f"alone <= {max_gemms:.2f}, on the medians of rounds; cuBLAS: dense bf16 GEMMs of equal FLOPs, "
                 "ms over ours; fwd, bwd fused / v1: each pass timed apart (a backward after its own untimed "
                 "forward), for where a fwd+bwd difference comes from; f+b / (fwd + bwd): a path's step over "
                 "its passes timed apart (above 1: they cost more back to back).")
    return "\n".join(lines)


def report(args):
    rows = read_manifest(args.manifest)
    for r in rows:
        judge(r, args.max_fused_over_v1, args.max_over_gemms)
    text = table(rows, args.max_fused_over_v1, args.max_over_gemms)
    clock_text = clock_table(rows)
    if clock_text:
        text += "\n\nThe GPU during each path's fwd+bwd replays (scripts/clock-trace.py, NVML; medians over the rounds):\n\n" \
            + clock_text
    print(text)
    with open(os.path.join(args.out_dir, "preset-sweep.md"), "w") as fh:
        fh.write(text + "\n")
    combined = {
        "tool": "scripts/preset-sweep.sh",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": args.commit, "gpu": args.gpu, "rounds": args.rounds, "reps": args.reps, "warmup": args.warmup,
        "quick": args.quick,
        "targets": {"max_fused_over_v1": args.max_fused_over_v1,
                    "max_forward_over_gemms_alone": args.max_over_gemms,
                    "max_backward_over_gemms_alone": args.max_over_gemms},
        "rows": rows,
    }
    for r in rows:  # the bench JSON's name beside this file, not the machine's path
        r["json"] = os.path.basename(r["json"])
    with open(os.path.join(args.out_dir, "preset-sweep.json"), "w") as fh:
        json.dump(combined, fh, indent=1)
        fh.write("\n")
    with open(os.path.join(args.out_dir, "verdicts.tsv"), "w") as fh:
        for r in rows:
            took = f" ({r['seconds']} s)" if r["verdict"] in ("PASS", "MISS") else ""
            fh.write(f"{r['name']}\t{r['verdict']}\t{r['text']}{took}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rows = sub.add_parser("rows")
    rows.add_argument("models")
    rep = sub.add_parser("report")
    rep.add_argument("manifest")
    rep.add_argument("out_dir")
    rep.add_argument("--commit", default="unknown")
    rep.add_argument("--gpu", default="unknown")
    rep.add_argument("--rounds", type=int)
    rep.add_argument("--reps", type=int)
    rep.add_argument("--warmup", type=int)
    rep.add_argument("--quick", action="store_true")
    rep.add_argument("--max-fused-over-v1", type=float, default=1.00)
    rep.add_argument("--max-over-gemms", type=float, default=1.06)
    args = parser.parse_args()
    if args.command == "rows":
        print("\n".join(preset_rows(args.models)))
    else:
        report(args)


if __name__ == "__main__":
    sys.exit(main())
