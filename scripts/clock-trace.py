#!/usr/bin/env python3
"""Runs a command while sampling one GPU's clocks and power through NVML (read only: nothing is
set), and says for each phase of the run how fast the GPU ran and what held its clocks back.

    scripts/clock-trace.py [--device 0] [--interval-ms 10] [--phase REGEX] [--json OUT] -- COMMAND [ARG...]

A phase starts at each line of the command's output (stdout and stderr, passed through as they
come) that matches --phase (default: caracal bench's progress lines, "caracal bench: <case>:
<pass>", a phase named by what follows "caracal bench: "); samples before the first such line
are the phase "(start)". Per phase, over its busy samples (the GPU not idle, as NVML's idle
reason says): their count, the SM clock's median and 10th percentile and the memory clock's
median (MHz), the power's mean and maximum (W; NVML's instant reading where the driver gives it)
and the enforced limit, the highest temperature (C), and each clock-event reason seen with the
share of the busy samples it was active in (sw power cap, hw slowdown, thermal, ...). Used to tell whether two paths timed in one run ran at the same clocks
(a path that draws more power can run slower in sustained replays than its kernels do alone).

Exit status: the command's; 2 when the arguments are bad or NVML (the nvidia-ml-py package, and
a driver) is not there. SIGTERM (`timeout`) stops the command too.
"""
import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

DEFAULT_PHASE = r"^caracal bench: (.+)$"
# NVML's clock-event reason bits (nvmlClocksEventReason*), in the order a reader looks for them.
REASONS = [(0x4, "sw power cap"), (0x80, "hw power brake"), (0x8, "hw slowdown"), (0x20, "sw thermal"),
           (0x40, "hw thermal"), (0x10, "sync boost"), (0x2, "application clocks"), (0x100, "display clocks"),
           (0x1, "idle")]
IDLE = 0x1
NVML_FI_DEV_POWER_INSTANT = 186  # nvmlDeviceGetFieldValues: this instant's power in mW


class NvmlSampler:
    """One GPU's readings through pynvml: sample() -> (sm_mhz, mem_mhz, watts, celsius, reasons)."""

    def __init__(self, device):
        try:
            import pynvml
        except ImportError:
            raise RuntimeError("NVML is not available: the nvidia-ml-py package (import pynvml) is not installed")
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            self.name = pynvml.nvmlDeviceGetName(self.handle)
            self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0
        except pynvml.NVMLError as e:
            raise RuntimeError(f"NVML could not open GPU {device}: {e}")
        self.name = self.name.decode() if isinstance(self.name, bytes) else self.name
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def _watts(self):
        try:
            value = self.nvml.nvmlDeviceGetFieldValues(self.handle, [NVML_FI_DEV_POWER_INSTANT])[0]
            if value.nvmlReturn == 0:
                return value.value.uiVal / 1000.0
        except self.nvml.NVMLError:
            pass
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0  # the driver's average

    def sample(self):
        n = self.nvml
        return (n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM), self._watts(),
                n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU), int(self.reasons(self.handle)))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples, marks, end):
    """Per phase, its figures as a dict. marks: [(start time, name)] in order, each phase lasting to
    the next mark (the last to `end`); samples: [(time, sm, mem, watts, celsius, reasons)]. Samples
    before the first mark (all of them, without marks) make the phase "(start)". A phase with no
    sample is listed with samples 0; the clocks, power and reasons are those of its busy samples
    (NVML's idle reason not set), and a phase with none has no figures."""
    first_mark = marks[0][0] if marks else end
    spans = []
    if not marks or any(t < first_mark for t, *_ in samples):
        spans.append(("(start)", min([first_mark] + [t for t, *_ in samples]), first_mark))
    spans += [(name, t, marks[i + 1][0] if i + 1 < len(marks) else end) for i, (t, name) in enumerate(marks)]
    rows = []
    for name, start, stop in spans:
        inside = [s for s in samples if start <= s[0] < stop]
        busy = [s for s in inside if not s[5] & IDLE]
        row = {"phase": name, "seconds": max(0.0, stop - start), "samples": len(inside), "busy_samples": len(busy)}
        if busy:  # the figures of the samples the GPU was not idle in (set-up and host waits excluded)
            sm = [s[1] for s in busy]
            watts = [s[3] for s in busy]
            row.update(sm_mhz_median=statistics.median(sm), sm_mhz_p10=percentile(sm, 0.10),
                       mem_mhz_median=statistics.median(s[2] for s in busy), watts_mean=statistics.fmean(watts),
                       watts_max=max(watts), celsius_max=max(s[4] for s in busy),
                       reasons={label: sum(1 for s in busy if s[5] & bit) / len(busy)
                                for bit, label in REASONS if bit != IDLE and any(s[5] & bit for s in busy)})
        rows.append(row)
    return rows


def table(rows, limit_w):
    lines = [f"{'phase':<44} {'s':>6} {'busy':>5} {'SM MHz':>7} {'p10':>5} {'mem':>5} {'W mean':>7} {'W max':>6} "
             f"{'C':>3}  clock-event reasons (share of samples)",
             "-" * 120]
    for r in rows:
        if not r["busy_samples"]:
            lines.append(f"{r['phase'][:44]:<44} {r['seconds']:6.2f} {0:5d}  (no busy sample; {r['samples']} idle)")
            continue
        reasons = ", ".join(f"{k} {v:.0%}" for k, v in r["reasons"].items()) or "none"
        lines.append(f"{r['phase'][:44]:<44} {r['seconds']:6.2f} {r['busy_samples']:5d} {r['sm_mhz_median']:7.0f} "
                     f"{r['sm_mhz_p10']:5.0f} {r['mem_mhz_median']:5.0f} {r['watts_mean']:7.1f} {r['watts_max']:6.1f} "
                     f"{r['celsius_max']:3.0f}  {reasons}")
    lines.append(f"(power limit enforced: {limit_w:.0f} W)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=int, default=0, help="the GPU's NVML index (0)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="between samples (10)")
    parser.add_argument("--phase", default=DEFAULT_PHASE, help="a line starting a phase (a regex; group 1 names it)")
    parser.add_argument("--json", help="write the phases' figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("clock-trace: no command given (usage: clock-trace.py [options] -- COMMAND [ARG...])", file=sys.stderr)
        return 2
    if not args.interval_ms > 0:
        print(f"clock-trace: --interval-ms must be > 0, got {args.interval_ms}", file=sys.stderr)
        return 2
    try:
        phase = re.compile(args.phase)
    except re.error as e:
        print(f"clock-trace: --phase is not a regular expression: {e}", file=sys.stderr)
        return 2
    try:
        sampler = NvmlSampler(args.device)
    except RuntimeError as e:
        print(f"clock-trace: {e}", file=sys.stderr)
        return 2

    samples, stop = [], threading.Event()

    def sample_until_stopped():
        while not stop.is_set():
            samples.append((time.monotonic(), *sampler.sample()))
            stop.wait(args.interval_ms / 1000.0)

    # SIGTERM (`timeout`) stops the command too. It is blocked while the command starts, so that no
    # command outlives this process; the command starts with it unblocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))
    except OSError as e:
        print(f"clock-trace: could not run {command[0]!r}: {e}", file=sys.stderr)
        return 2

    def stop_the_command(signum, _frame):
        process.terminate()
        try:
            process.wait(timeout=10)  # reaped: gone before this process is
        except subprocess.TimeoutExpired:
            process.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop_the_command)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one that came meanwhile is handled here
    thread = threading.Thread(target=sample_until_stopped, daemon=True)  # after the fork: no thread is forked
    thread.start()
    marks = []
    for line in process.stdout:
        now = time.monotonic()
        sys.stdout.write(line)
        sys.stdout.flush()
        match = phase.search(line.rstrip("\n"))
        if match:
            marks.append((now, match.group(1) if match.groups() else match.group(0)))
    rc = process.wait()
    end = time.monotonic()
    stop.set()
    thread.join()

    rows = summarize(samples, marks, end)
    print(f"\n==== clock trace, {sampler.name} (GPU {args.device}), a sample every {args.interval_ms:g} ms")
    print(table(rows, sampler.limit_w))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": sampler.name, "device": args.device, "interval_ms": args.interval_ms,
                       "power_limit_w": sampler.limit_w, "command": command, "exit_status": rc, "phases": rows}, f,
                      indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
