#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum`
log per kernel and grid: launches, total and mean time, and DRAM bytes moved per second.

    ncu --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        PROGRAM > ncu.csv; python3 scripts/gpu/ncu_summary.py ncu.csv
"""
import csv
import sys
from collections import defaultdict

UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9, "usecond": 1e-6,
         "msecond": 1e-3, "second": 1.0,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def main(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("no ncu csv rows in", path)
        return
    rows = csv.DictReader(lines[start:])
    kernels = {}
    for r in rows:
        key = (r["ID"], r["Kernel Name"].split("(")[0][:40], r.get("Grid Size", ""))
        v = float(r["Metric Value"].replace(",", "")) * UNITS.get(r["Metric Unit"], 1.0)
        kernels.setdefault(key, {})[r["Metric Name"]] = v
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for (_, name, grid), m in kernels.items():
        a = agg[(name, grid)]
        a[0] += 1
        a[1] += m.get("gpu__time_duration.sum", 0.0)
        a[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    total = sum(a[1] for a in agg.values())
    print(f"{len(kernels)} launches, {total * 1e3:.3f} ms of kernel time")
    print(f"{'kernel':40} {'grid':>16} {'n':>5} {'total ms':>9} {'mean us':>8} {'GB/s':>7} {'share':>6}")
    for (name, grid), (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:40]:
        print(f"{name:40} {grid:>16} {n:5d} {t * 1e3:9.3f} {t / n * 1e6:8.2f} "
              f"{b / t / 1e9 if t else 0:7.0f} {t / total:6.1%}")


if __name__ == "__main__":
    main(sys.argv[1])
