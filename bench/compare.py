#!/usr/bin/env python3
"""Compare two builds of sked on the same machine in one run: `sked-bench` of each build,
alternated round by round (the order swapped every round, so that a drift of the machine
falls on both), then the median of every metric per build.

    bench/compare.py --old OLD/target/release --new target/release --rounds 7 -- w2 w4

Each directory holds that build's `sked-bench` and `sked-worker` (`cargo build --release
--bin sked-bench --bin sked-worker`). Everything after `--` goes to both `sked-bench`s.
The JSON results of every run stay in --out (default: a new directory under /tmp)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def fmt(x):
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="directory of the old build's binaries")
    parser.add_argument("--new", required=True, help="directory of the new build's binaries")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each build (default 3)")
    parser.add_argument("--out", help="directory for the results (default: a new one in /tmp)")
    parser.add_argument("bench_args", nargs="*", help="arguments of sked-bench, after --")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    builds = {"old": args.old, "new": args.new}
    for name, directory in builds.items():
        for binary in ("sked-bench", "sked-worker"):
            path = os.path.join(directory, binary)
            if not os.access(path, os.X_OK):
                parser.error(f"--{name}: {path} is not an executable")
    out = args.out or tempfile.mkdtemp(prefix="sked-compare-")
    os.makedirs(out, exist_ok=True)

    runs = {}  # (workload, metric, unit) -> build -> [median of each run]
    for r in range(1, args.rounds + 1):
        order = ["old", "new"] if r % 2 else ["new", "old"]
        for name in order:
            directory = builds[name]
            results = os.path.join(out, f"{name}.{r}")
            print(f"round {r}/{args.rounds}: {name} ({time.strftime('%H:%M:%S')})", flush=True)
            with open(results + ".log", "w") as log:
                code = subprocess.call(
                    [os.path.join(directory, "sked-bench"), *args.bench_args,
                     "--worker-bin", os.path.join(directory, "sked-worker"),
                     "--results-dir", results],
                    stdout=log, stderr=subprocess.STDOUT)
            if code != 0:
                sys.exit(f"sked-bench of the {name} build failed (exit {code}): see {results}.log")
            for file in sorted(os.listdir(results)):
                if file.endswith(".json"):
                    with open(os.path.join(results, file)) as f:
                        for m in json.load(f)["results"]:
                            key = (m["workload"], m["metric"], m["unit"])
                            runs.setdefault(key, {}).setdefault(name, []).append(m["median"])

    print(f"\nmedians of {args.rounds} alternated runs (results in {out}):")
    for (workload, metric, unit), by_build in runs.items():
        old, new = by_build.get("old"), by_build.get("new")
        if not old or not new:
            continue
        a, b = statistics.median(old), statistics.median(new)
        change = f"{(b - a) / a * 100:+.1f} %" if a else "n/a"
        print(f"{workload} {metric} [{unit}]\n  old {fmt(a)}  new {fmt(b)}  ({change})"
              f"\n  old runs {' '.join(map(fmt, old))}"
              f"\n  new runs {' '.join(map(fmt, new))}")


if __name__ == "__main__":
    main()
