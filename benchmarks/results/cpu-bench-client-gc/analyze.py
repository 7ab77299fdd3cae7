"""Per level: the first wave's sends, its first write, and the client's collections in its way in and over the level.

python analyze.py PAUSES_JSON BENCH_JSON...
"""

import json
import sys
from pathlib import Path

pauses = json.loads(Path(sys.argv[1]).read_text())
for path in sys.argv[2:]:
    result = json.loads(Path(path).read_text())
    for level in result["levels"]:
        traces = level["trace"]
        first = [t for t in traces if t.get("first_of_stream")]
        sent0, sent1 = min(t["sent"] for t in first), max(t["sent"] for t in first)
        write0, write1 = min(t["writing"] for t in first), max(t["writing"] for t in first)
        inside = [(g, round(ms, 1)) for (t, g, ms) in pauses if sent0 <= t <= write1 and g >= 1]
        end = max(t["end"] for t in traces)
        during = [p for p in pauses if sent0 <= p[0] <= end]
        full = [ms for (_, g, ms) in during if g == 2]
        print(
            f"{result['label']} c={level['concurrency']}: sends {1e3 * (sent1 - sent0):.1f} ms, first write "
            f"{1e3 * (write0 - sent0):.1f} ms, gen1/2 pauses in the wave's way in {inside}; level: gen2 {len(full)}x "
            f"max {max(full, default=0):.1f} ms, all {sum(ms for (_, _, ms) in during):.0f} ms; "
            f"TTFA p50/p95 {level['ttfa_ms_p50']:.0f}/{level['ttfa_ms_p95']:.0f}"
        )
