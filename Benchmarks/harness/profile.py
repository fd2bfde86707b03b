"""--profile: where packs's time goes. `packs fetch` of the 64 MiB pack under valgrind's callgrind (user
space, instruction counts), and of the 1 GiB pack (or the 64 MiB one if case 1 did not run) under
`perf record` (kernel included). Printed after the results."""
import os
import shutil
import subprocess

from .measure import MiB, log, sh


def demangled(text):
    demangler = shutil.which("swift-demangle")
    if demangler:
        return subprocess.run([demangler, "--simplified"], input=text, stdout=subprocess.PIPE, text=True).stdout
    return text


def callgrind(b):
    manifest = f"{b.base}/prof/manifest.json"
    work = b.fresh("profile")
    out = os.path.join(b.tmp, "callgrind.out")
    log("profile: packs fetch of a 64 MiB pack under callgrind…")
    # Valgrind 3.19 (Debian 12) cannot read the DWARF 5 that Swift 6.3 writes ("unhandled dwarf2 abbrev
    # form code 0x25", then it gives up): profile a copy without debug info; the symbol table stays.
    binary = os.path.join(b.tmp, "packs-nodebug")
    sh(["objcopy", "--strip-debug", b.packs, binary])
    # Valgrind 3.19's rt_sigsuspend wrapper writes into the caller's mask, and libdispatch's main
    # thread (dispatchMain → _dispatch_sigsuspend) passes a const one in read-only memory: valgrind
    # dies with SIGSEGV ("the 'impossible' happened"). A preloaded sigsuspend hands it a copy.
    shim_c, shim = os.path.join(b.tmp, "sigsuspend-shim.c"), os.path.join(b.tmp, "sigsuspend-shim.so")
    with open(shim_c, "w") as f:
        f.write("#define _GNU_SOURCE\n#include <signal.h>\n#include <dlfcn.h>\n"
                "int sigsuspend(const sigset_t *mask) {\n"
                "    static int (*real)(const sigset_t *);\n"
                "    if (!real) real = (int (*)(const sigset_t *))dlsym(RTLD_NEXT, \"sigsuspend\");\n"
                "    sigset_t copy = *mask;\n    return real(&copy);\n}\n")
    sh(["gcc", "-shared", "-fPIC", "-O1", shim_c, "-o", shim, "-ldl"])
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        binary, "--home", f"{work}/home", "--quiet", "fetch", manifest, "com.bench.prof"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, LD_PRELOAD=shim))
    if p.returncode != 0:
        print(f"\nNOTE: the callgrind run exited {p.returncode}:\n```\n{p.stderr[-3000:]}\n```")
        return
    for inclusive, top in (("no", 30), ("yes", 40)):
        text = subprocess.run(["callgrind_annotate", f"--inclusive={inclusive}", out],
                              stdout=subprocess.PIPE, text=True).stdout
        text = demangled(text).splitlines()
        title = "exclusive" if inclusive == "no" else "inclusive"
        print(f"\n## callgrind: packs fetch of a 64 MiB tar pack, {title} instructions (top {top})\n\n```")
        # The header, then the first `top` function lines.
        header = next((i for i, l in enumerate(text) if "file:function" in l), 0)
        print("\n".join(text[:header + 2 + top]))
        print("```")


def perf(b):
    """callgrind sees neither the kernel (most of the time here) nor SHA-NI (valgrind hides it, so
    OpenSSL takes its slower path): also sample the real run, kernel included, with perf."""
    if not shutil.which("perf"):
        print("\nNOTE: perf is not installed (linux-perf); no kernel-inclusive profile.")
        return
    name = "big" if "big" in b.data else "prof"
    manifest = f"{b.base}/{name}/manifest.json"
    product = f"com.bench.{name}"
    work = b.fresh("perf")
    data = os.path.join(b.tmp, "perf.data")
    pack = b.data[name]
    log(f"profile: packs fetch of the {pack['contentLength'] / MiB:.0f} MiB pack under perf record -e cpu-clock…")
    b.prepare(pack["contentLength"] * 2 + 256 * MiB, [os.path.join(b.site, name, pack["url"])])
    time_file = os.path.join(b.tmp, "perf-time.out")
    p = subprocess.run(["perf", "record", "-q", "-o", data, "-F", "999", "-e", "cpu-clock", "--",
                        "/usr/bin/time", "-f", "%e %U %S", "-o", time_file,
                        b.packs, "--home", f"{work}/home", "--quiet", "fetch", manifest, product],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print(f"\nNOTE: perf record exited {p.returncode}:\n```\n{p.stderr[-2000:]}\n```")
        return
    with open(time_file) as f:
        wall, user, sys_ = (float(x) for x in f.read().split()[-3:])
    samples = subprocess.run(["perf", "script", "-i", data, "-F", "period"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.count("\n")
    print(f"\nperf run: {wall:.2f} s wall, {user:.2f} s user + {sys_:.2f} s sys by rusage; perf sampled "
          f"{samples / 999:.2f} CPU-seconds ({samples} samples at 999 Hz). CPU time that rusage counts beyond the sampled "
          f"seconds is time the guest's perf cannot see (in a VM: the vCPU stalled in the hypervisor, e.g. while it "
          f"faults in guest pages).")
    for sort, top in (("dso", 12), ("pid,dso", 12), ("dso,sym", 25)):
        text = subprocess.run(["perf", "report", "-i", data, "--no-children", "-g", "none", "--sort", sort, "--stdio"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        lines = [l for l in demangled(text).splitlines() if l.strip() and not l.startswith("#")]
        print(f"\n## perf (cpu-clock, 999 Hz, kernel included): packs fetch of the {pack['contentLength'] / MiB:.0f} MiB pack, "
              f"by {sort.replace('pid', 'thread').replace(',', ' and ')} (top {top})\n\n```")
        print("\n".join(lines[:top]))
        print("```")
    shutil.rmtree(work, ignore_errors=True)
