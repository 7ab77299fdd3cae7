"""The package installs, imports cheaply and is discovered by vLLM's plugin loader."""

import re
from importlib.metadata import entry_points

from tests.conftest import run_python


def test_import_is_light():
    code = "import sys, vllm_omni_kani; print('vllm' in sys.modules, 'torch' in sys.modules)"
    assert run_python(code).stdout.split() == ["False", "False"]


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("kani_tts") == "vllm_omni_kani:register"


def test_vllm_loads_the_plugin_and_register_is_idempotent():
    code = (
        "import vllm_omni_kani, vllm.plugins as p\n"
        "p.load_general_plugins()\n"
        "assert vllm_omni_kani._registered\n"
        "vllm_omni_kani.register(); vllm_omni_kani.register()\n"
        "from vllm_omni_kani import patch\n"
        "print('patches', patch.apply_all())\n"
    )
    out = run_python(code)
    # On CPU every CPU-guarded patch is active (vLLM 0.26 here).
    assert "keep_narrow_conv_weights_unpacked" in out.stdout
    assert "rotate_flattened_heads_on_cpu" in out.stdout


def test_runner_outputs_pickle_their_payload_tensors_as_numpy():
    """Worker -> engine core is a pickle per step on CPU: payload tensors come back equal, as one shared list when the
    runner passed one, and a row sliced from a big batch does not drag the batch's storage along."""
    code = (
        "import pickle, torch, vllm_omni_kani\n"
        "from vllm_omni_kani import patch\n"
        "assert patch.pickle_runner_payload_tensors_as_numpy()\n"
        "from vllm_omni.outputs import OmniModelRunnerOutput\n"
        "batch = torch.arange(256 * 3 * 64, dtype=torch.long).view(256 * 64, 3)\n"
        "hidden = torch.randn(256, 16).to(torch.bfloat16)\n"
        "mm = [{'codes': {'audio': batch[i * 64:(i + 1) * 64]}, 'hidden': hidden[i]} for i in range(256)]\n"
        "out = OmniModelRunnerOutput(req_ids=[str(i) for i in range(256)], req_id_to_index={},\n"
        "    sampled_token_ids=[], logprobs=None, prompt_logprobs_dict={}, pooler_output=None,\n"
        "    multimodal_outputs=mm, inter_stage_outputs=mm)\n"
        "row = OmniModelRunnerOutput(req_ids=['0'], req_id_to_index={}, sampled_token_ids=[], logprobs=None,\n"
        "    prompt_logprobs_dict={}, pooler_output=None, multimodal_outputs=mm[:1], inter_stage_outputs=None)\n"
        "back = pickle.loads(pickle.dumps(out))\n"
        "assert back.inter_stage_outputs is back.multimodal_outputs\n"
        "for got, want in zip(back.multimodal_outputs, mm):\n"
        "    assert torch.equal(got['codes']['audio'], want['codes']['audio'])\n"
        "    assert got['hidden'].dtype == torch.bfloat16 and torch.equal(got['hidden'], want['hidden'])\n"
        "print('row bytes', len(pickle.dumps(row)), 'batch bytes', batch.numel() * 8)\n"
    )
    out = run_python(code)
    row_bytes, batch_bytes = map(int, re.search(r"row bytes (\d+) batch bytes (\d+)", out.stdout).groups())
    assert row_bytes < batch_bytes / 100  # one 64 x 3 row, not the 16,384 x 3 batch


def test_runner_token_spans_come_from_the_query_start_buffer():
    """The vectorised spans equal the per-request loop they replace, on vLLM's own CPU/GPU buffer, for a mixed
    prefill + decode step, and are plain ints."""
    code = (
        "import types, numpy as np, torch, vllm_omni_kani\n"
        "from vllm_omni_kani import patch\n"
        "assert patch.vectorise_request_token_spans()\n"
        "from vllm.v1.utils import CpuGpuBuffer\n"
        "from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner\n"
        "scheduled = np.array([37, 1, 1, 5, 1] + [1] * 250, dtype=np.int32)\n"
        "qsl = CpuGpuBuffer(len(scheduled) + 9, dtype=torch.int32, device='cpu', pin_memory=False, with_numpy=True)\n"
        "qsl.np[0] = 0\n"
        "qsl.np[1:len(scheduled) + 1] = np.cumsum(scheduled)\n"
        "qsl.np[len(scheduled) + 1:] = -7  # past the batch: never read\n"
        "runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=[str(i) for i in range(255)]),\n"
        "    query_start_loc=qsl)\n"
        "spans = OmniGPUModelRunner._compute_request_token_spans(runner, scheduled)\n"
        "want = [(int(qsl.cpu[i]), int(qsl.cpu[i]) + int(scheduled[i])) for i in range(255)]\n"
        "assert spans == want, (spans[:6], want[:6])\n"
        "assert all(type(a) is int and type(b) is int for a, b in spans)\n"
        "assert spans[:3] == [(0, 37), (37, 38), (38, 39)]\n"
    )
    run_python(code)
