"""The report: the summary table (medians, ratios PackDelivery ÷ peer, verdicts against the targets), the
sections cases add (more tables of their own), every run, and the notes."""
import os
import statistics


def median(values):
    return statistics.median(values) if values else float("nan")


def fmt_s(seconds):
    return f"{seconds:.2f} s" if seconds >= 0.995 else f"{seconds * 1000:.0f} ms"


def fmt_runs(values):
    """Seconds of several runs: the median, then min–max, in one unit."""
    if len(values) < 2:
        return fmt_s(median(values))
    if median(values) >= 0.995:
        return f"{median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"
    return f"{median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}–{max(values) * 1000:.0f})"


def fmt_mib(kib):
    return f"{kib / 1024:.1f} MiB"


class Report:
    def __init__(self):
        self.rows = []       # the summary table: (case, what, PackDelivery, peer, peer's value, ratio, target, result)
        self.sections = []   # text printed after it (cases' own tables), in the order the cases added them
        self.raw = []        # every run, for the appendix: (case, command name, round, Run)
        self.notes = []      # anything broken or surprising

    def row(self, case, what, ours, peer_name, peer, target=None, unit="s"):
        """ours and peer: a number, or a list of runs' values (shown as median, then min–max)."""
        def value(v):
            return median(v) if isinstance(v, list) else v

        def show(v):
            one = fmt_s if unit == "s" else (lambda x: f"{x:.2f}")
            if isinstance(v, list) and len(v) > 1:
                if unit == "s":
                    return fmt_runs(v)
                return f"{one(median(v))} ({one(min(v))}–{one(max(v))})"
            return one(value(v))
        ratio = value(ours) / value(peer) if value(peer) else float("nan")
        verdict = ""
        if target is not None:
            verdict = "pass" if ratio <= target else "**FAIL**"
        self.rows.append((str(case), what, show(ours), peer_name, show(peer), f"{ratio:.2f}",
                          f"≤ {target}" if target is not None else "–", verdict))
        return ratio

    def busy_row(self, case, runs):
        """The share of all cores that packs, nginx and the kernel's writeback kept busy during packs's runs
        (medians). Near 100 % the fetch is bound by the CPU it needs: overlapping its stages better cannot make
        it faster, only doing less work can."""
        cores = os.cpu_count() or 1
        own = median([r.cpu for r in runs])
        nginx = median([r.nginx for r in runs])
        other = median([r.other for r in runs])
        wall = median([r.wall for r in runs])
        self.rows.append((str(case), f"packs: CPU of packs {own:.2f} s + nginx {nginx:.2f} s + other (writeback) {other:.2f} s "
                                     f"over {wall:.2f} s × {cores} cores", f"{(own + nginx + other) / (wall * cores):.0%} busy",
                          "", "", "", "", ""))

    def broken(self):
        return any(n.startswith("BROKEN") for n in self.notes)

    def print(self):
        print("\n## Results (medians, then min–max of the runs; ratios are of the medians, PackDelivery ÷ peer)\n")
        print("| case | what | PackDelivery | peer | peer | ratio | target | result |")
        print("|---|---|---:|---|---:|---:|---|---|")
        for row in self.rows:
            print("| " + " | ".join(row) + " |")
        for section in self.sections:
            print(section)
        print("\n### Every run\n")
        print("Other CPU: CPU seconds the rest of the machine used during the run (all CPUs' busy time minus the "
              "run's own user+sys and nginx's). Kernel threads working for the run count here too: writeback, and "
              "(with the memory warm-up) the guest reporting the touched-and-freed memory back to the hypervisor "
              "while the run leaves it unused. Several seconds with --no-warm means something else was running.\n")
        print("| case | command | round | wall s | user s | sys s | max RSS MiB | other CPU s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for case, name, r, run in self.raw:
            print(f"| {case} | {name} | {r} | {run.wall:.3f} | {run.user:.2f} | {run.sys:.2f} | {run.rss_kib / 1024:.1f} | {run.other:.2f} |")
        disturbed = [(case, name, r, run) for case, name, r, run in self.raw if run.other > max(0.5, 0.25 * run.wall)]
        if disturbed:
            print(f"\nWARNING: {len(disturbed)} of {len(self.raw)} runs had other CPU > max(0.5 s, 25 % of the wall "
                  f"time) (other work on the machine, or free page reporting after the warm-up): "
                  + ", ".join(f"case {c} {n} round {r} ({run.other:.1f} s)" for c, n, r, run in disturbed[:12]))
        for note in self.notes:
            print(f"\nNOTE: {note}")
