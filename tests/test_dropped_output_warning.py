"""The orchestrator's warning for a dropped output names the request and the count of known ones, not every id: with
the codec's PCM16 audio a third of the requests' last Stage-0 outputs arrive after their codec finished, and each
line listed ~500 ids (docs/BENCHMARKS.md, fortieth set)."""

from __future__ import annotations

import re

from tests.conftest import run_python


def test_a_dropped_output_is_logged_short_and_still_counted_apart():
    code = (
        "import logging\n"
        "from vllm_omni.engine import orchestrator\n"
        "from vllm_omni_kani import patch\n"
        "records = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        records.append(record.getMessage())\n"
        "orchestrator.logger.addHandler(Keep())\n"
        "known = [f'speech-{i:04d}' for i in range(500)]\n"
        "assert patch.shorten_dropped_output_warnings()\n"
        "orchestrator.logger.warning(patch.DROPPED_OUTPUT_WARNING, 'speech-gone', 0, known)\n"
        "orchestrator.logger.warning('[Orchestrator] something else %s', known[:2])\n"
        "for line in records:\n"
        "    print('LOGGED', line)\n"
    )
    lines = [line.removeprefix("LOGGED ") for line in run_python(code).stdout.splitlines() if line.startswith("LOGGED")]
    assert lines == [
        "[Orchestrator] Dropping output for unknown req speech-gone at stage-0 (500 requests known)",
        "[Orchestrator] something else ['speech-0000', 'speech-0001']",
    ]
    from benchmarks.audio_vs_frames import _DROPPED

    assert _DROPPED.search(lines[0]).group(1) == "speech-gone"
    assert re.search(r"speech-0499", lines[0]) is None


def test_the_upstream_warning_is_the_one_the_filter_knows():
    """vLLM-Omni's orchestrator still logs the warning this filter rewrites (else the patch would do nothing)."""
    import inspect

    from vllm_omni.engine import orchestrator

    from vllm_omni_kani import patch

    assert f'"{patch.DROPPED_OUTPUT_WARNING}"' in inspect.getsource(orchestrator)
    assert orchestrator.logger.name == patch.ORCHESTRATOR_LOGGER
