"""``benchmarks/gpu/lib.sh``'s ``cleanup`` kills the servers a GPU phase left, never the shell that runs it.

A device call's own command line can name the server (a ``pkill`` of it before the suite): a ``pkill -f`` then
killed that call's shell after its first A/B side. Here a wrapper shell whose command line holds the pattern runs a
script that sources ``lib.sh``, starts a process named like a server and calls ``cleanup``; the pattern is unique to
the test (``CLEANUP_PATTERN``), so nothing else on the machine matches it. It runs in a scratch directory: sourced
in the repository, ``lib.sh`` would unpack a carried ``.devsrc/src.tar`` over the working tree.
"""

from __future__ import annotations

import subprocess
import uuid

from tests.conftest import REPO_ROOT

SCRIPT = f"""
source {REPO_ROOT / "benchmarks" / "gpu" / "lib.sh"}
bash -c 'exec -a "python3 $CLEANUP_PATTERN ckpt" sleep 60' &
server=$!
sleep 0.5
cleanup
wait "$server" 2> /dev/null
echo "server exit $?"
"""


def test_cleanup_kills_a_server_and_spares_its_own_ancestors(tmp_path):
    pattern = f"kani-cleanup-test-{uuid.uuid4().hex[:12]}"
    (tmp_path / "phase.sh").write_text(SCRIPT)
    # The wrapper's command line holds the pattern and it runs a command after the script, so bash cannot exec the
    # script in its place: the wrapper stays the script's parent, as the device call's shell was.
    wrapper = f'true "{pattern}"; bash {tmp_path / "phase.sh"}; echo "wrapper alive"'
    env = {"PATH": "/usr/bin:/bin", "CLEANUP_PATTERN": pattern, "R": str(tmp_path), "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "-c", wrapper], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "server exit 137" in done.stdout  # SIGKILL
    assert done.stdout.rstrip().endswith("wrapper alive")
