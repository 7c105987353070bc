"""Sum py-spy collapsed stacks (``py-spy record --format raw``) per function: self and inclusive samples.

    /var/cache/zjusct-cloud/venv/bin/python bench/pyspy_top.py FILE [--top 25] [--thread-prefix NAME]

Each input line is ``frame;frame;...;frame COUNT`` (outermost first; with ``--threads`` the first frame names the
thread). A frame is ``function (file:line)``; lines are dropped so one function sums over its lines. Prints the
top functions by self samples and by inclusive samples (a function counted once per stack), as percentages of all
samples, and the samples per thread group (the asyncio loop, the handler thread pool, others).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def _func(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)``."""
    name, _sep, where = frame.partition(" (")
    where = _LINE.sub(")", "(" + where) if where else ""
    path = where.strip("()")
    short = "/".join(path.split("/")[-2:]) if path else ""
    return f"{name} ({short})" if short else name


def summarise(path: Path) -> tuple[int, Counter, Counter, Counter]:
    """``(total samples, self per function, inclusive per function, samples per thread frame)``."""
    total, own, incl, threads = 0, Counter(), Counter(), Counter()
    for line in path.read_text().splitlines():
        stack, _sep, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if frames and frames[0].startswith(("thread (", "process ")):
            threads[frames[0]] += n
            frames = frames[1:]
        funcs = [_func(f) for f in frames]
        total += n
        if funcs:
            own[funcs[-1]] += n
        for f in set(funcs):
            incl[f] += n
    return total, own, incl, threads


def main() -> int:
    """Print the summary of one collapsed-stack file."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    total, own, incl, threads = summarise(args.file)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples (not idle)")
    print("\nthreads:")
    for t, n in threads.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {t}")
    print("\nself:")
    for f, n in own.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {f}")
    print("\ninclusive:")
    for f, n in incl.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
