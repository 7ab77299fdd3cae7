"""The orchestrator's per-output stats (``patch.constant_time_output_stats``) on a real vLLM-Omni output processor,
driven as ``benchmarks/output_stats.py`` drives it: both ways leave every request the same stats record."""

from __future__ import annotations

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture
def output_stats(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    import output_stats

    return output_stats


def test_the_constant_time_stats_leave_the_records_vllm_omni_leaves(output_stats):
    methods = output_stats.sides()
    assert methods[False] != methods[True]
    records = {}
    for patched in (False, True):
        output_stats.use(methods[patched])
        seconds, records[patched] = output_stats.run(requests=6, steps=40)
        assert seconds > 0
    output_stats.use(methods[True])
    assert output_stats.same_records(records[False], records[True])
    first = records[True]["speech-0"]
    # 40 steps: the prefill's first token, then 38 latencies by the snapshot before the last step.
    assert first["num_generation_tokens"] == 39 and len(first["vllm_itls_ms"]) == 38 and first["vllm_itl_ms"] > 0
