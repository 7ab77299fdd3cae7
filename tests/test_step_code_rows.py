"""Stage 0's step codes handed to the scheduler as one tensor and per-request spans (``KANI_STEP_CODE_ROWS``).

Each request's row must be the payload vLLM-Omni's output builder makes for it (its own helpers cut, flatten,
partition and check it here), a request no later stage reads gets none, the rows cross a pickle as they are, and the
offline pipeline speaks the same audio with the switch on, saying its runner took the rows path.
"""

from __future__ import annotations

import pickle

import numpy as np
import torch
from vllm_omni.data_entry_keys import flatten_payload
from vllm_omni.utils.mm_outputs import build_mm_cpu, partition_payload_list, to_payload_element
from vllm_omni.worker.gpu_ar_model_runner import _ensure_tensor_values

from tests.conftest import run_python, speaks_the_same_with_switch
from vllm_omni_kani import envs
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.worker.step_code_rows import FLAT_CODES_KEY, step_code_rows, step_codes


def a_step(seed: int, requests: int) -> tuple[torch.Tensor, list[str], dict[str, int], np.ndarray, np.ndarray]:
    """A mixed step: prompt chunks and one-token decodes in a shuffled batch order, codes over every token."""
    rng = np.random.default_rng(seed)
    scheduled = rng.choice([1, 1, 1, 7, 30], size=requests).astype(np.int32)
    query_start_loc = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    codes = torch.from_numpy(rng.integers(-1, 2**20, size=int(query_start_loc[-1]))).long()
    req_ids = [f"req-{i}" for i in rng.permutation(requests)]
    return codes, req_ids, {rid: i for i, rid in enumerate(req_ids)}, query_start_loc, scheduled


def builder_payloads(codes, req_ids, index, downstream, query_start_loc, scheduled) -> list:
    """The inter-stage payloads vLLM-Omni's builder makes for this step, from its own helpers in its order."""
    mm_cpu = build_mm_cpu(flatten_payload({tl.CODES_KEY[0]: {tl.CODES_KEY[1]: codes}}))
    payloads = []
    for rid in req_ids:
        if rid not in downstream:
            payloads.append({})
            continue
        idx = index[rid]
        start, end = int(query_start_loc[idx]), int(query_start_loc[idx]) + int(scheduled[idx])
        payload = {
            key: to_payload_element(value, idx, start, end, seq_len=codes.shape[0], scheduled_seq_len=codes.shape[0])
            for key, value in mm_cpu.items()
        }
        payloads.append(flatten_payload(payload))
    inter_stage, client = partition_payload_list(payloads)
    assert client is None  # the codes are never a client output
    return [None if p is None else _ensure_tensor_values(p) for p in inter_stage]


def test_each_row_is_the_payload_vllm_omni_builds():
    for seed, requests, skipped in ((0, 1, 0), (1, 37, 0), (2, 256, 5), (3, 64, 64)):
        codes, req_ids, index, query_start_loc, scheduled = a_step(seed, requests)
        downstream = set(req_ids[skipped:])
        rows = step_code_rows(codes, req_ids, index, downstream, torch.from_numpy(query_start_loc), scheduled)
        want = builder_payloads(codes, req_ids, index, downstream, query_start_loc, scheduled) if downstream else None
        assert len(rows) == requests
        for i in range(requests):
            got = rows[i]
            if want is None or want[i] is None:
                assert got is None, (seed, i)
                continue
            assert got.keys() == want[i].keys() == {FLAT_CODES_KEY}
            assert torch.equal(got[FLAT_CODES_KEY], want[i][FLAT_CODES_KEY]), (seed, i)
        # The rows cover every token of the requests that asked, once.
        asked = [rows[i][FLAT_CODES_KEY] for i in range(requests) if rows[i] is not None]
        assert sum(r.shape[0] for r in asked) == sum(int(scheduled[index[rid]]) for rid in downstream)


def test_only_the_codes_alone_take_the_rows():
    codes = torch.zeros(5, dtype=torch.long)
    assert step_codes({"codes": {"audio": codes}}) is codes
    assert step_codes({FLAT_CODES_KEY: codes}) is codes
    for other in (None, {}, {"codes": {"audio": codes}, "hidden": codes}, {"codes": {"audio": codes, "text": codes}},
                  {"codes": {"audio": [1, 2]}}, {"audio": codes}):  # fmt: skip
        assert step_codes(other) is None, other


def test_rows_cross_a_pickle_as_they_are():
    codes, req_ids, index, query_start_loc, scheduled = a_step(4, 40)
    downstream = set(req_ids[3:])
    rows = step_code_rows(codes, req_ids, index, downstream, query_start_loc, scheduled)
    back = pickle.loads(pickle.dumps(rows))
    assert len(back) == len(rows)
    for i in range(len(rows)):
        assert (back[i] is None) == (rows[i] is None)
        if rows[i] is not None:
            assert torch.equal(back[i][FLAT_CODES_KEY], rows[i][FLAT_CODES_KEY])
    # Inside a runner output, with the runner outputs' numpy pickling patch applied as in a CPU worker.
    code = (
        "import pickle, torch, vllm_omni_kani\n"
        "from vllm_omni_kani import patch\n"
        "from vllm_omni_kani.worker.step_code_rows import StepCodeRows, FLAT_CODES_KEY\n"
        "import numpy as np\n"
        "assert patch.pickle_runner_payload_tensors_as_numpy()\n"
        "from vllm_omni.outputs import OmniModelRunnerOutput\n"
        "codes = torch.arange(10)\n"
        "rows = StepCodeRows(codes, np.array([0, 4]), np.array([4, 10]), np.array([True, True]))\n"
        "out = OmniModelRunnerOutput(req_ids=['a', 'b'], req_id_to_index={'a': 0, 'b': 1}, sampled_token_ids=[],\n"
        "    logprobs=None, prompt_logprobs_dict={}, pooler_output=None, multimodal_outputs=None,\n"
        "    inter_stage_outputs=rows)\n"
        "back = pickle.loads(pickle.dumps(out)).inter_stage_outputs\n"
        "assert isinstance(back, StepCodeRows) and back.__len__() == 2\n"
        "assert torch.equal(back[1][FLAT_CODES_KEY], codes[4:10])\n"
        "print('ok')\n"
    )
    assert "ok" in run_python(code).stdout


def test_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(envs.KANI_STEP_CODE_ROWS, raising=False)
    assert envs.step_code_rows()
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(envs.KANI_STEP_CODE_ROWS, off)
        assert not envs.step_code_rows()
    monkeypatch.setenv(envs.KANI_STEP_CODE_ROWS, "1")
    assert envs.step_code_rows()


def test_the_offline_pipeline_speaks_the_same_with_step_rows(tiny_parallel, tmp_path):
    """The offline pipeline, greedy, with ``KANI_STEP_CODE_ROWS`` on and off: the same audio (within one PCM16 step),
    and the run with it on says its Stage-0 runner handed the codes over as rows."""
    speaks_the_same_with_switch(
        tiny_parallel, tmp_path, envs.KANI_STEP_CODE_ROWS, "step codes handed to the scheduler as one tensor"
    )
