"""The API server's event-loop samples in a py-spy raw file (``--threads --gil -f raw``), and those in the route
walks: vLLM's Prometheus instrumentation naming the route (``_get_route_name``) and Starlette's router (any
``.matches`` outside it).

    python3 route_samples.py served-first/spy.txt.gz
"""

import collections
import gzip
import sys


def main(path: str) -> None:
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if count.isdigit():
                rows.append((stack.split(";"), int(count)))
    loops = collections.Counter()
    for frames, n in rows:
        if any("Runner.run" in f for f in frames):
            loops[frames[0]] += n
    loop = loops.most_common(1)[0][0]  # the event loop's thread: uvloop's Runner.run under it
    total = walk = router = 0
    for frames, n in rows:
        if frames[0] != loop:
            continue
        total += n
        if any("_get_route_name" in f for f in frames):
            walk += n
        elif any(".matches (" in f for f in frames):
            router += n
    print(f"{path}: event-loop samples {total}, the instrumentation's walk {walk}, the router's matches {router}")


if __name__ == "__main__":
    main(sys.argv[1])
