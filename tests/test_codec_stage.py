"""Stage 1 as vLLM-Omni runs it: built from a real VllmConfig, weights loaded, windows decoded.

No engine: the model is constructed and called the way the generation runner does (constructor,
``load_weights`` with the Stage-0 weight iterator, ``forward`` with per-request payloads).
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLE_RATE, SAMPLES_PER_FRAME, KaniConfigError
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import TRIGGER, KernelTrace
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import RECEPTIVE_FIELD_FRAMES, load_codec
from vllm_omni_kani.model_executor.models.kani_tts.token_layout import CODEBOOK_SIZE

SPF = SAMPLES_PER_FRAME


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def vllm_config_for(path):
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(model=str(path), dtype="float32", max_model_len=256, enforce_eager=True)
    return VllmConfig(model_config=model_config, device_config=DeviceConfig("cpu"))


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("flattened")


@pytest.fixture(scope="module")
def stage(ckpt):
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import KaniNanoCodecForGeneration

    model = KaniNanoCodecForGeneration(vllm_config=vllm_config_for(ckpt))
    offered = iter([("model.embed_tokens.weight", torch.zeros(2, 2)), ("lm_head.weight", torch.zeros(2, 2))])
    loaded = model.load_weights(offered)
    assert next(offered, None) is None  # the Stage-0 weights were drained
    assert loaded == {name for name, _ in model.named_parameters()}
    return model


@pytest.fixture(scope="module")
def reference(ckpt):
    return load_codec(ckpt)


def codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK_SIZE, (frames, 4), generator=torch.Generator().manual_seed(seed))


def payload(window: torch.Tensor, left, finished=False) -> dict:
    return {"codes": {"audio": window}, "meta": {"left_context_size": left, "stream_finished": finished}}


def run(stage, infos: list[dict]) -> dict:
    with torch.inference_mode():
        out = stage(
            input_ids=torch.zeros(len(infos), dtype=torch.int64),
            positions=torch.zeros(len(infos), dtype=torch.int64),
            runtime_additional_information=infos,
            seq_token_counts=[1] * len(infos),
        )
    assert out.text_hidden_states is None
    mm = out.multimodal_outputs
    assert len(mm["model_outputs"]) == len(mm["sr"]) == len(infos)
    assert all(int(sr) == SAMPLE_RATE for sr in mm["sr"])
    assert all(w.dtype == torch.float32 and w.ndim == 1 for w in mm["model_outputs"])
    return mm


def test_one_step_decodes_every_request_in_batch_order(stage, reference):
    first = codes(30, 1)
    later = codes(33, 2)
    mm = run(
        stage,
        [
            payload(first, torch.tensor(0)),  # stream start: no context
            {},  # scheduled without a chunk
            payload(later, [RECEPTIVE_FIELD_FRAMES], finished=torch.tensor(True)),
        ],
    )
    wavs = mm["model_outputs"]
    assert wavs[1].numel() == 0
    assert wavs[0].shape == (30 * SPF,) and wavs[2].shape == (5 * SPF,)
    torch.testing.assert_close(wavs[0], reference.decode_window(first, 0), atol=1e-4, rtol=0)
    torch.testing.assert_close(wavs[2], reference.decode_window(later, 28), atol=1e-4, rtol=0)


def test_streamed_chunks_equal_one_decode(stage, reference):
    """Two requests streamed side by side (3 frames first, then 16 per chunk, 28 frames of context)."""
    utterances = [codes(70, 3), codes(45, 4)]
    sent = [0, 0]
    streamed: list[list[torch.Tensor]] = [[], []]
    while any(s < len(u) for s, u in zip(sent, utterances, strict=True)):
        infos, active = [], []
        for i, utt in enumerate(utterances):
            if sent[i] < len(utt):
                end = min(len(utt), 3 if sent[i] == 0 else sent[i] + 16)
                left = min(RECEPTIVE_FIELD_FRAMES, sent[i])
                infos.append(payload(utt[sent[i] - left : end], left, finished=end == len(utt)))
                active.append(i)
                sent[i] = end
        for i, wav in zip(active, run(stage, infos)["model_outputs"], strict=True):
            streamed[i].append(wav)
    for utt, pieces in zip(utterances, streamed, strict=True):
        full = reference.decode(utt[None])[0]
        torch.testing.assert_close(torch.cat(pieces), full, atol=1e-4, rtol=0)


def test_whole_utterance_window_is_split_exactly(stage, reference):
    utt = codes(80, 5)
    stage.decode_max_frames, before = 24, stage.decode_max_frames
    try:
        wav = run(stage, [payload(utt, 0, finished=True)])["model_outputs"][0]
    finally:
        stage.decode_max_frames = before
    torch.testing.assert_close(wav, reference.decode(utt[None])[0], atol=1e-4, rtol=0)


def test_dummy_run_without_payload_gives_empty_audio(stage):
    with torch.inference_mode():
        out = stage(input_ids=torch.zeros(16, dtype=torch.int64), positions=torch.arange(16))
    assert [w.numel() for w in out.multimodal_outputs["model_outputs"]] == [0]
    assert stage.compute_logits(out) is None
    assert stage.embed_input_ids(torch.zeros(5, dtype=torch.int64)).shape == (5, 1)
    stage.on_requests_finished({"a", "b"})


def test_bad_window_is_logged_and_skipped(stage, caplog):
    good = codes(4, 6)
    with caplog.at_level(logging.ERROR):
        too_big = torch.full((3, 4), CODEBOOK_SIZE)
        mm = run(stage, [payload(too_big, 0), payload(good, 0), payload(good, 9), payload(good.float(), 0)])
    assert [w.numel() for w in mm["model_outputs"]] == [0, 4 * SPF, 0, 0]
    assert "codes must be in [0, 4032)" in caplog.text
    assert "codes must be integers" in caplog.text
    assert "left_context_size=9 outside the 4-frame window" in caplog.text


def test_codec_disagreeing_with_stage0_refuses_to_start(ckpt, tmp_path):
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import KaniNanoCodecForGeneration

    other = shutil.copytree(ckpt, tmp_path / "ckpt")
    config = json.loads((other / "config.json").read_text())
    config["kani_tts"]["sample_rate"] = 24000
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        KaniConfigError, match=r"codec sample_rate=22050 but Stage 0 \(kani_tts.sample_rate\) expects 24000"
    ):
        KaniNanoCodecForGeneration(vllm_config=vllm_config_for(other))


def test_graph_frame_buckets_hold_every_recurring_window():
    """CUDA-graph frame buckets: multiples of 8 up to the longest window, plus each recurring window exactly."""
    from types import SimpleNamespace

    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import KaniNanoCodecForGeneration
    from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import ChunkPolicy

    def frame_buckets(extra, additional=None):
        fake = SimpleNamespace(
            vllm_config=SimpleNamespace(additional_config=additional or {}), chunk_policy=ChunkPolicy.from_extra(extra)
        )
        return KaniNanoCodecForGeneration._graph_buckets(fake)[1]

    assert frame_buckets({}) == [3, 8, 16, 24, 32, 40, 44, 48]  # no ramp: first chunk 3, steady 28 + 16
    assert frame_buckets({"codec_chunk_frames": 64}) == [3, *range(8, 96, 8), 92, 96]
    ramp = frame_buckets({"codec_chunk_frames": 16, "max_codec_chunk_frames": 64})
    assert ramp == sorted({3, 44, 60, 92, *range(8, 97, 8)})
    assert frame_buckets({}, {"codec_cudagraph_frames": [44]}) == [44]  # explicit buckets win


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the one-copy transfer only acts on device tensors (CUDA)")
def test_a_steps_device_audio_reaches_the_host_in_one_copy_equal_to_per_request_copies():
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import audio_to_host

    device = torch.device("cuda")
    batch = torch.randn(3, 5 * SPF, device=device)
    audio = [batch[0, : 2 * SPF], torch.empty(0, device=device), batch[2], batch[1, :SPF]]
    host = audio_to_host(audio)
    assert [w.device.type for w in host] == ["cpu"] * 4
    for got, want in zip(host, audio, strict=True):
        assert torch.equal(got, want.cpu())


def test_cpu_audio_is_handed_over_as_it_is():
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import audio_to_host

    audio = [torch.randn(SPF), torch.empty(0)]
    for non_blocking in (False, True):
        assert all(got is want for got, want in zip(audio_to_host(audio, non_blocking), audio, strict=True))


@pytest.mark.parametrize("switch", ["", "0", "1", "off", "on"])
def test_the_copy_skips_the_wait_only_on_cuda_under_async_scheduling_unless_switched_off(monkeypatch, switch):
    from vllm_omni_kani.envs import KANI_CODEC_ASYNC_COPY
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import copies_audio_without_waiting

    monkeypatch.setenv(KANI_CODEC_ASYNC_COPY, switch)
    on = switch not in ("0", "off")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert copies_audio_without_waiting(True, cuda) is on
    # Without async scheduling the runner hands its output straight to the engine; a CPU decode has nothing to copy.
    assert not any(copies_audio_without_waiting(a, d) for a, d in ((False, cuda), (None, cuda), (True, cpu)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copy that skips the wait only exists for device audio")
def test_audio_in_one_copy_without_waiting_is_whole_once_vllms_async_output_is_read():
    """The contract ``audio_to_host(non_blocking=True)`` relies on: vLLM's ``AsyncGPUModelRunnerOutput`` (built the
    way vLLM-Omni's generation runner builds it, after the forward) makes its copy stream wait for the forward's
    stream, and ``get_output()`` syncs on that; the audio is produced by a long chain of kernels just before."""
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import audio_to_host

    device = torch.device("cuda")
    x = torch.randn(2048, 2048, device=device) / 2048**0.5
    for _ in range(200):  # tens of ms of queued work before the audio exists
        x = torch.tanh(x @ x) * 1.5
    batch = x[:3].repeat(1, 4)[:, : 4 * SPF]  # 3 rows of 4 frames, produced by the queued chain
    audio = [batch[0, : 2 * SPF], torch.empty(0, device=device), batch[2], batch[1, :SPF]]
    host = audio_to_host(audio, non_blocking=True)
    assert [w.device.type for w in host] == ["cpu"] * 4 and host[0].is_pinned()
    ids = [f"r{i}" for i in range(len(audio))]
    runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)})
    pending = AsyncGPUModelRunnerOutput(
        model_runner_output=runner_output,
        sampled_token_ids=torch.tensor([], device=device),
        logprobs_tensors=None,
        invalid_req_indices=[],
        async_output_copy_stream=torch.cuda.Stream(),
        vocab_size=1,
    )
    assert pending.get_output() is runner_output
    for got, want in zip(host, audio, strict=True):
        assert torch.equal(got, want.cpu())


def test_a_kernel_trace_window_records_the_codec_step(stage, tmp_path):
    """``KANI_KERNEL_TRACE``'s hook: the codec's forward opens the window at the trigger and the next step closes it."""
    (tmp_path / TRIGGER).touch()
    # The stage decodes on the CPU here (also on a GPU machine): its trace records CPU ops.
    stage.kernel_trace = KernelTrace("stage1", folder=str(tmp_path), seconds=0.0, cuda=False)
    try:
        run(stage, [payload(codes(12, 5), torch.tensor(0))])  # opens, then decodes inside the window
        run(stage, [payload(codes(12, 6), torch.tensor(0))])  # closes
    finally:
        stage.kernel_trace = KernelTrace("stage1", folder="")
    (path,) = tmp_path.glob("stage1-*.json")
    names = {event["name"] for event in json.loads(path.read_text())["traceEvents"] if event.get("cat") == "cpu_op"}
    assert any("conv" in name for name in names), sorted(names)[:40]


def test_pcm16_audio_is_the_float_audio_as_libsndfile_writes_it(ckpt, stage):
    """``codec_pcm16_audio``: the same windows give int16 samples, each the 16-bit PCM of the float stage's sample
    (within one step: two stages, two float computations), empty requests empty int16."""
    from vllm.config import VllmConfig

    from vllm_omni_kani.entrypoints.openai.pcm16 import pcm16
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import KaniNanoCodecForGeneration

    base = vllm_config_for(ckpt)
    config = VllmConfig(
        model_config=base.model_config, device_config=base.device_config, additional_config={"codec_pcm16_audio": True}
    )
    pcm_stage = KaniNanoCodecForGeneration(vllm_config=config)
    pcm_stage.load_weights(iter([]))  # the same checkpoint's codec
    assert pcm_stage.pcm16_audio and not stage.pcm16_audio
    infos = [payload(codes(12, 7), 0), {}, payload(codes(40, 8), RECEPTIVE_FIELD_FRAMES, finished=True)]
    with torch.inference_mode():
        got = pcm_stage(input_ids=torch.zeros(3, dtype=torch.int64), runtime_additional_information=infos)
    want = run(stage, infos)["model_outputs"]
    got = got.multimodal_outputs["model_outputs"]
    assert [w.dtype for w in got] == [torch.int16] * 3
    assert [w.numel() for w in got] == [12 * SPF, 0, 12 * SPF]
    for g, w in zip(got, want, strict=True):
        assert np.abs(g.numpy().astype(np.int32) - pcm16(w.numpy())).max(initial=0) <= 1


def test_pcm16_audio_reaches_the_host_converted_in_one_pass():
    from vllm_omni_kani.entrypoints.openai.pcm16 import pcm16
    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import audio_to_host

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = torch.randn(3, 2 * SPF, device=device) * 0.7
    audio = [batch[0], torch.empty(0, device=device), batch[2, :SPF], batch[1]]
    for non_blocking in (False, True):
        host = audio_to_host(audio, non_blocking, pcm16=True)
        assert [(w.device.type, w.dtype) for w in host] == [("cpu", torch.int16)] * 4
        for got, want in zip(host, audio, strict=True):
            assert got.numpy().tolist() == pcm16(want.cpu().numpy()).tolist()
