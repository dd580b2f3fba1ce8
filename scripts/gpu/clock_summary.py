#!/usr/bin/env python3
"""Summarizes the kernel clock of a traced decode step (backend/cuda/graph.rs `clock_report`,
printed with `LATTICE_CUDA_TRACE=1 LATTICE_CUDA_DEFINES=LATTICE_KERNEL_CLOCK`): the launches
of a step grouped by their place in a layer, counted from the layer's decode attention launch
(the launch whose block has ATTN_BLOCK threads, 128 by default), with the mean time from each
launch's first released block to the next launch's ("next": its share of the step's chain),
how long before its release its first block had started ("lead"), and how far its last block's
release trailed its first ("skew"), in µs.

    python3 scripts/gpu/clock_summary.py clock.log [--step N] [--attn-block 128]
"""
import argparse
import re
import statistics as st

LINE = re.compile(
    r"cuda clock: +(\d+) grid +(\d+) block +(\d+) start +(-?[\d.]+) release +(-?[\d.]+) "
    r"last +(-?[\d.]+) next +(\S+)")
HEAD = re.compile(r"cuda clock: step of (\d+) rows: (\d+) launches, ([\d.]+) us")


def steps(path):
    """The launches of each traced step in the log, in order."""
    out, cur = [], None
    for line in open(path, errors="replace"):
        h = HEAD.search(line)
        if h:
            cur = {"rows": int(h.group(1)), "span": float(h.group(3)), "launches": []}
            out.append(cur)
            continue
        m = LINE.search(line)
        if m and cur is not None:
            i, grid, block, start, rel, last, nxt = m.groups()
            cur["launches"].append({
                "grid": int(grid), "block": int(block), "start": float(start),
                "release": float(rel), "last": float(last),
                "next": float(nxt) if nxt != "NaN" else None})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--step", type=int, default=-1, help="which traced step (default: the last)")
    ap.add_argument("--attn-block", type=int, default=128)
    a = ap.parse_args()
    all_steps = steps(a.log)
    if not all_steps:
        raise SystemExit("no kernel clock in " + a.log)
    s = all_steps[a.step]
    launches = s["launches"]
    attn = [i for i, l in enumerate(launches) if l["block"] == a.attn_block]
    print(f"step of {s['rows']} rows: {len(launches)} launches, {s['span']:.1f} us; "
          f"{len(attn)} attention launches")
    groups = {}
    for i, l in enumerate(launches):
        before = [j for j in attn if j <= i]
        if not before:
            key = ("before the first layer", i)
        elif i > attn[-1] and i - attn[-1] >= (attn[1] - attn[0] if len(attn) > 1 else 99) - 1:
            key = ("after the last layer", i - attn[-1])
        else:
            key = ("layer", i - before[-1])
        groups.setdefault(key, []).append(l)
    total = 0.0
    print(f"{'place':>28} {'grid':>6} {'block':>5} {'n':>3} {'next':>7} {'lead':>7} {'skew':>7}")
    for key in sorted(groups, key=lambda k: ({"before the first layer": 0, "layer": 1,
                                              "after the last layer": 2}[k[0]], k[1])):
        ls = groups[key]
        nx = [l["next"] for l in ls if l["next"] is not None]
        mean_next = st.mean(nx) if nx else float("nan")
        total += sum(nx)
        lead = st.mean(l["release"] - l["start"] for l in ls)
        skew = st.mean(l["last"] - l["release"] for l in ls)
        place = f"{key[0]} +{key[1]}"
        print(f"{place:>28} {ls[0]['grid']:>6} {ls[0]['block']:>5} {len(ls):>3} "
              f"{mean_next:7.2f} {lead:7.2f} {skew:7.2f}")
    print(f"sum of next: {total:.1f} us")


if __name__ == "__main__":
    main()
