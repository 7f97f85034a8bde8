#!/usr/bin/env python3
"""Runs the JCT baselines of the README (issue 3) and prints them as Markdown tables.

Usage: cargo build --release && python3 scripts/jct-baselines.py [--seed 42]
Needs only the Python standard library and the release binary.
"""
import argparse
import json
import statistics
import subprocess

POLICIES = "random,fifo,best-fit,dot-product,gpu-packing,gpu-clustering,fgd,topo-pack,tiresias,priority,sjf-oracle"
BIN = "./target/release/marshal"


def sim(trace, cluster, seed):
    out = subprocess.run(
        [BIN, "sim", "--trace", trace, "--cluster", cluster, "--policy", POLICIES,
         "--seed", str(seed), "--format", "json"],
        check=True, capture_output=True, text=True).stdout
    return {r["policy"]: r for r in json.loads(out)}


def table(title, runs, published=None):
    """Mean over traces of each measure, per policy."""
    print(f"\n{title}\n")
    print("| policy | JCT mean (h) | p50 | p99 | queue (h) | makespan (h) | GPU alloc % | local % | preemptions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for policy in POLICIES.split(","):
        rs = [r[policy] for r in runs]
        m = lambda k, scale=3600.0: statistics.mean(r[k] or 0.0 for r in rs) / scale
        print(f"| {policy} | {m('jct_mean_s'):.2f} | {m('jct_p50_s'):.2f} | {m('jct_p99_s'):.2f} | "
              f"{m('queue_mean_s'):.2f} | {m('makespan_s'):.1f} | {m('gpu_alloc_pct', 1):.1f} | "
              f"{m('locality_pct', 1):.1f} | {m('preemptions', 1):.0f} |")
    if published:
        print(f"\n{published}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--only", choices=["pollux", "philly", "itp"], default=None)
    a = ap.parse_args()
    if a.only in (None, "pollux"):
        runs = [sim(f"pollux-{k}", "pollux-64", a.seed) for k in range(1, 9)]
        table("Pollux workloads 1–8 (160 jobs each, 1.0× load) on pollux-64, mean over the 8 workloads", runs)
    if a.only in (None, "philly"):
        runs = [sim(f"philly-week{k}", "philly", a.seed) for k in range(2, 16)]
        table("Philly one-week windows 2–15 on the philly cluster, mean over windows (weeks 0 and 1 hold 9 and 13 jobs)", runs)
        table("Philly, the whole trace (82,247 jobs) on the philly cluster", [sim("philly", "philly", a.seed)])
    if a.only in (None, "itp"):
        for c in ["itp-195job", "itp-cluster02", "itp-cluster03", "itp-cluster06"]:
            table(f"{c} on elasticflow-128", [sim(c, "elasticflow-128", a.seed)])


if __name__ == "__main__":
    main()
