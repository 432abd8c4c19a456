"""Median wall time of ``import keeper_middleware`` in fresh interpreters, for installed trees
compared side by side (runs interleaved so machine load hits both alike).

    python scripts/import_time.py OLD_TARGET NEW_TARGET [--runs 15]

Each target is a folder a wheel was installed into with ``pip install --target``; the
interpreter's own site-packages supply the dependencies.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def once(target: str) -> float:
    env = {**os.environ, "PYTHONPATH": target}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import keeper_middleware"], env=env, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    for target in args.targets:
        once(target)  # warm the file cache
    times: dict[str, list[float]] = {t: [] for t in args.targets}
    for _ in range(args.runs):
        for target in args.targets:
            times[target].append(once(target))
    print("| tree | median s | min s | runs |\n|---|---|---|---|")
    for target, seen in times.items():
        print(f"| {target} | {statistics.median(seen):.3f} | {min(seen):.3f} | {len(seen)} |")
    print(f"\nload average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
