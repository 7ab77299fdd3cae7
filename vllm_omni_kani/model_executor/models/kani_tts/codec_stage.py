"""Stage 1 of Kani TTS: codec frames → 22,050 Hz audio, as a vLLM-Omni generation-stage model.

Every scheduled request brings a window ``[left context | new frames]`` of ``[F, 4]`` codes (codebook
order cb1..cb4, values 0..4031) and gets back the audio of its new frames, ``(F - left)·1,764`` float32
samples, or with ``additional_config`` ``codec_pcm16_audio: true`` the same samples as 16-bit PCM (int16, the values
libsndfile writes; converted on the codec's device, so the API server streams bytes as they come and half as many
bytes cross the stages). Two ways to decode it:

- **Stateful streams** (connector extra ``codec_stateful_decode: true``, chunks numbered by
  ``meta.chunk_seq``): each request keeps the causal state of every decoder layer in a slot of a
  preallocated pool (``codec_streams.py``), so a chunk decodes only its new frames. Slots are freed
  with a stream's last chunk, or when vLLM reports the request finished or aborted. On CUDA the narrow
  residual layers run channels-last (``nanocodec/streaming.py``; ``additional_config``
  ``codec_channels_last_below``, 0 for none), and the work between the convs runs in Triton kernels
  (``nanocodec/between_convs.py``; ``codec_fused_between_convs: false`` for cuDNN's and PyTorch's ops). With
  those kernels and TF32 the channels-last layers' convs run in float16 (``codec_channels_last_dtype``:
  ``float32`` keeps them TF32), and each residual add also writes the next unit's input half-snake
  (``codec_fused_next_activation: false`` leaves it to the half-snake kernel). Each layer's states go into and out
  of its conv input in one Triton kernel each way (``nanocodec/state_copies.py``; ``codec_fused_state_copies: false``
  for PyTorch's copies).
- **Stateless windows** (whole utterances with ``async_chunk: false``, and chunks carrying context):
  all windows of a step decode in one right-padded batch; with at least ``RECEPTIVE_FIELD_FRAMES``
  (28) frames of left context the streamed audio equals one decode of the whole utterance.

Payload, per request (``runtime_additional_information[i]``)::

    {"codes": {"audio": LongTensor[F, 4]},
     "meta": {"left_context_size": int | 0-d tensor | [int], "stream_finished": bool-ish,
              "chunk_seq": int (streams only)}}

A request without codes (profile or dummy run, a step without a chunk) gets an empty tensor; a
malformed window is logged and also gets an empty tensor, because raising here would stop the
engine for every request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm_omni.model_executor.models.output_templates import OmniOutput

from vllm_omni_kani.entrypoints.openai.pcm16 import pcm16_tensor
from vllm_omni_kani.envs import codec_async_copy, trace_chunks
from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.configuration import CONFIG_KEY, additional_config
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import KernelTrace
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import (
    NanoCodecDecoder,
    check_matches_stage0,
    find_codec,
    fused,
    load_decoder_state,
    read_codec_config,
    read_decoder_tensors,
    stage0_audio_settings,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.decoder import check_codes
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import (
    DEFAULT_BATCH_BUCKETS,
    CodecGraphs,
    StreamingGraphs,
    block_splitting,
    check_replay_plan,
)
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import StreamingCodec
from vllm_omni_kani.model_executor.models.kani_tts.pinned_staging import to_host_in_stream_order
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import ChunkPolicy

logger = init_logger(__name__)

# Longest run of new frames decoded as one batch row (20 s): a whole-utterance window (the
# non-streaming path) is cut into pieces with 28 frames of context each, which is exact and keeps
# activation memory and the set of batch shapes bounded. Connector extra: codec_decode_max_frames.
DEFAULT_DECODE_MAX_FRAMES = 256
# Frame buckets of the codec's CUDA graphs step by this much, up to the longest streaming window.
GRAPH_FRAME_STEP = 8
# State slots per Stage-1 max_num_seqs. A stream holds its slot from its first chunk to its last, also while others
# are scheduled, and when the codec lags Stage 0 every admitted request can be mid-stream: the API server admits
# max_num_seqs x KANI_SPEECH_QUEUE_FACTOR (default 4). Additional-config override: codec_state_slots.
STATE_SLOTS_PER_SEQ = 4
# Conv precision on CUDA (additional_config codec_precision overrides): the fastest mode within 60 dB SNR of strict
# float32 on the real-size codec (docs/BENCHMARKS.md). CPUs decode in strict float32, the NeMo-parity mode.
DEFAULT_CUDA_PRECISION = "tf32"
# additional_config codec_channels_last_dtype: the narrow channels-last layers' conv dtype (nanocodec/streaming.py).
CHANNELS_LAST_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16}


def _first(value: Any) -> Any:
    """The scalar inside a 0-d / 1-element tensor or a 1-element list (how meta values arrive)."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1)[0].item() if value.numel() else None
    if isinstance(value, list | tuple):
        return _first(value[0]) if value else None
    return value


def window_of(info: Any) -> tuple[torch.Tensor, int] | None:
    """``(codes [F, 4] on the CPU, left_context_frames)`` of one request's payload, or None (no codes)."""
    if not isinstance(info, Mapping) or not isinstance(info.get("codes"), Mapping):
        return None
    audio = info["codes"].get("audio")
    codes = None if audio is None else torch.as_tensor(audio)
    if codes is None or codes.numel() == 0:
        return None
    left = _first(_meta(info).get("left_context_size", 0))
    return codes.to("cpu"), int(left or 0)


def _meta(info: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = info.get("meta")
    return meta if isinstance(meta, Mapping) else {}


def stream_position(info: Any) -> tuple[int | None, bool]:
    """``(chunk_seq or None, stream_finished)`` of one request's payload."""
    meta = _meta(info) if isinstance(info, Mapping) else {}
    seq = _first(meta.get("chunk_seq"))
    return (None if seq is None else int(seq)), bool(_first(meta.get("stream_finished", False)))


def audio_to_host(audio: list[torch.Tensor], non_blocking: bool = False, pcm16: bool = False) -> list[torch.Tensor]:
    """Each request's audio on the CPU, through one device-to-host copy for the whole step; with ``pcm16``, as 16-bit
    PCM converted in one pass over the step's samples before the copy.

    vLLM-Omni's generation runner copies every request's output to the CPU itself, one blocking copy per request
    (256 a step at 256 streams, each a device sync and a GIL round trip); for a CPU tensor that copy is a no-op.
    ``non_blocking``: the copy lands in pinned host memory and nothing waits for it here. Only for a runner that wraps
    the step's output in vLLM's ``AsyncGPUModelRunnerOutput`` (async scheduling): its copy stream waits for this
    stream and ``get_output()`` syncs on that, so the samples are whole before the engine reads them, while the step
    loop schedules and launches the next step in the meantime (``copies_audio_without_waiting``).
    """
    moved = [i for i, wav in enumerate(audio) if wav.device.type != "cpu" or (pcm16 and wav.dtype != torch.int16)]
    if not moved:
        return audio
    flat = torch.cat([audio[i].reshape(-1).float() for i in moved])
    if pcm16:
        flat = pcm16_tensor(flat)
    if flat.device.type != "cpu":
        flat = to_host_in_stream_order(flat) if non_blocking else flat.cpu()
    out = list(audio)
    for i, part in zip(moved, flat.split([audio[i].numel() for i in moved]), strict=True):
        out[i] = part.view(audio[i].shape)
    return out


def graph_buckets(config: Mapping[str, Any], policy: ChunkPolicy) -> tuple[list[int], list[int]]:
    """(batch, frames) CUDA-graph buckets of Stage 1's ``additional_config`` ``config`` for the chunking ``policy``;
    frames default to the longest window.

    ``codec_cudagraph_batch_sizes: []`` turns the graphs off. Frames: every multiple of 8 up to the longest
    streaming window, plus the windows that recur exactly (``ChunkPolicy.recurring_windows``), so they replay
    unpadded: the first chunk (``initial_codec_chunk_frames``) and ``codec_left_context_frames`` + each steady
    chunk size (``codec_chunk_frames``, and with a ramp every size up to ``max_codec_chunk_frames``); padding
    the steady 44 frames to 48 cost 9% of the codec's batched throughput (docs/BENCHMARKS.md).
    """
    batches = config.get("codec_cudagraph_batch_sizes", DEFAULT_BATCH_BUCKETS)
    frames = config.get("codec_cudagraph_frames")
    if frames is None:
        windows = policy.recurring_windows()
        top = -(-max(windows) // GRAPH_FRAME_STEP) * GRAPH_FRAME_STEP
        frames = sorted({*range(GRAPH_FRAME_STEP, top + 1, GRAPH_FRAME_STEP), *windows})
    return [int(b) for b in batches], [int(t) for t in frames]


def copies_audio_without_waiting(async_scheduling: bool | None, device: torch.device) -> bool:
    """Whether a codec stage's steps hand their audio over with ``audio_to_host(non_blocking=True)``: on CUDA, under
    vLLM's async scheduling (vLLM turns it on for Stage 1 unless the YAML turns it off), unless
    ``KANI_CODEC_ASYNC_COPY`` turns it off (0). Without async scheduling the runner's output goes to the engine as it
    is, so the copy must be whole first."""
    return codec_async_copy() and bool(async_scheduling) and device.type == "cuda"


class KaniNanoCodecForGeneration(nn.Module):
    """NanoCodec decoder of ``<checkpoint>/codec/`` behind the vLLM-Omni generation-model contract."""

    input_modalities = "audio"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.vllm_config = vllm_config
        self.have_multimodal_outputs = True  # the runner takes OmniOutput.multimodal_outputs
        self.has_preprocess = False
        self.has_postprocess = False
        self.enable_update_additional_information = True  # fresh payload every step
        self.requires_raw_input_tokens = True
        self.requires_request_ids = True  # stateful streams are keyed by request id
        model_config = vllm_config.model_config
        self.codec_path = find_codec(model_config.model)
        config = read_codec_config(self.codec_path)
        check_matches_stage0(config, stage0_audio_settings(getattr(model_config.hf_config, CONFIG_KEY, None)))
        # Parameters exist now (float32, on the stage's device) so the memory profiler sees them;
        # load_weights fills them. float32 whatever the stage dtype: bf16 misses the parity bar.
        self.decoder = NanoCodecDecoder(config).eval()
        self.sample_rate = config.sample_rate
        extra = self._connector_extra()
        self.decode_max_frames = int(extra.get("codec_decode_max_frames", DEFAULT_DECODE_MAX_FRAMES))
        # The chunking Stage 0 will send (a bad combination of knobs fails here, at load).
        self.chunk_policy = ChunkPolicy.from_extra(extra)
        self.graphs: CodecGraphs | None = None
        # The state pool exists now, like the weights, so the memory profiler sees it.
        self.streams = self._make_streams() if self.chunk_policy.stateful else None
        # How a step's rows split into graph replays (nanocodec/replay_plan.py); checked here, used at capture.
        self.replay_plan = check_replay_plan(
            str(additional_config(vllm_config).get("codec_replay_plan", "cheapest")), "codec_replay_plan"
        )
        self._trace = trace_chunks()
        self.kernel_trace = KernelTrace("stage1", cuda=self.decoder.device.type == "cuda")
        self.async_audio_copy = copies_audio_without_waiting(
            getattr(vllm_config.scheduler_config, "async_scheduling", False), self.decoder.device
        )
        if self.async_audio_copy:
            logger.info("Kani codec stage: audio copied to the host without waiting (async scheduling)")
        self.pcm16_audio = bool(additional_config(vllm_config).get("codec_pcm16_audio", False))
        if self.pcm16_audio:
            logger.info("Kani codec stage: audio handed over as 16-bit PCM (codec_pcm16_audio)")

    def _make_streams(self) -> CodecStreams:
        config = additional_config(self.vllm_config)
        max_seqs = int(getattr(self.vllm_config.scheduler_config, "max_num_seqs", 0) or 0)
        slots = int(config.get("codec_state_slots", max(STATE_SLOTS_PER_SEQ * max_seqs, 1)))
        batches = [int(b) for b in config.get("codec_cudagraph_batch_sizes", DEFAULT_BATCH_BUCKETS)]
        below = config.get("codec_channels_last_below")
        between = config.get("codec_fused_between_convs")  # default: on CUDA with Triton (nanocodec/between_convs.py)
        copies = config.get("codec_fused_state_copies")  # default: on CUDA with Triton (nanocodec/state_copies.py)
        narrow_dtype = config.get("codec_channels_last_dtype")  # default: float16 with TF32 and the kernels above
        if narrow_dtype is not None and narrow_dtype not in CHANNELS_LAST_DTYPE_NAMES:
            raise ValueError(
                f"codec_channels_last_dtype must be one of {', '.join(CHANNELS_LAST_DTYPE_NAMES)}; got {narrow_dtype!r}"
            )
        codec = StreamingCodec(
            self.decoder,
            num_slots=slots,
            scratch_rows=max(batches, default=1),
            channels_last_below=None if below is None else int(below),
            fuse_between_convs=None if between is None else bool(between),
            channels_last_dtype=None if narrow_dtype is None else CHANNELS_LAST_DTYPE_NAMES[narrow_dtype],
            fuse_next_activation=bool(config.get("codec_fused_next_activation", True)),
            fuse_state_copies=None if copies is None else bool(copies),
        )
        logger.info(
            "Kani codec stage: stateful streams, %d state slots, residual layers %s channels-last",
            slots,
            sorted(codec.channels_last_layers) or "none",
        )
        return CodecStreams(codec, max_piece_frames=self.decode_max_frames)

    def _connector_extra(self) -> Mapping[str, Any]:
        connector = getattr(self.vllm_config.model_config, "stage_connector_config", None)
        extra = (
            connector.get("extra", connector) if isinstance(connector, Mapping) else getattr(connector, "extra", None)
        )
        return extra if isinstance(extra, Mapping) else {}

    # -- vLLM model interface --------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        # Token ids are placeholders here; the runner still wants an embedding per token.
        return torch.zeros((input_ids.shape[0], 1), device=input_ids.device, dtype=torch.float32)

    def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> None:
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Drain the Stage-0 weights vLLM offers and load the codec from the checkpoint's ``codec/``."""
        for _ in weights:
            pass
        load_decoder_state(self.decoder, read_decoder_tensors(self.codec_path))
        precision = str(
            additional_config(self.vllm_config).get(
                "codec_precision", DEFAULT_CUDA_PRECISION if self.decoder.device.type == "cuda" else "fp32"
            )
        )
        self.decoder.set_precision(precision)
        fused_activations = bool(
            additional_config(self.vllm_config).get("codec_fused_activations", self.decoder.device.type == "cuda")
        )
        self.decoder.set_fused_activations(fused_activations and fused.available())
        if self.streams is not None:
            self.streams.codec.refresh()  # the channels-last convs' padded weights, from the loaded ones
        codec = None if self.streams is None else self.streams.codec
        logger.info(
            "Kani codec stage: %s convs (channels-last layers' convs in %s), %s half-snakes, "
            "between-conv kernels %s%s%s",
            precision,
            "-" if codec is None else str(codec.channels_last_dtype).removeprefix("torch."),
            "fused (Triton)" if self.decoder.fused_activations else "eager",
            "off"
            if codec is None or not codec.between_fused
            else "on" + (" (residual adds write the next half-snake)" if codec.fuse_next_activation else ""),
            "" if codec is None else f"; {codec.state_bytes_per_slot / 1024:.1f} KiB of state a stream",
            "" if codec is None or not codec.state_copies_fused else "; states copied by one kernel each way",
        )
        self._capture_graphs()
        return {name for name, _ in self.named_parameters()}

    def _graph_buckets(self) -> tuple[list[int], list[int]]:
        """(batch, frames) buckets from the stage's ``additional_config`` and chunking (:func:`graph_buckets`)."""
        return graph_buckets(additional_config(self.vllm_config), self.chunk_policy)

    def _capture_graphs(self) -> None:
        """Capture the codec's CUDA graphs (CUDA only); a failure leaves the stage decoding eagerly."""
        if self.decoder.device.type != "cuda":
            return
        batches, frames = self._graph_buckets()
        if not batches or not frames:
            logger.info("Kani codec stage: CUDA graphs off (codec_cudagraph_batch_sizes is empty)")
            return
        if self.streams is not None:
            graphs: CodecGraphs | StreamingGraphs = StreamingGraphs(
                self.streams.codec, batches, frames, plan=self.replay_plan
            )
        else:
            graphs = CodecGraphs(self.decoder, batches, frames)
        started = time.perf_counter()
        try:
            # Inside vLLM's model load, where large blocks are not split (graphs.VLLM_LOAD_MAX_SPLIT_MB).
            with block_splitting():
                count = graphs.capture()
        except RuntimeError:
            logger.warning("Kani codec stage: CUDA graph capture failed; decoding eagerly", exc_info=True)
            return
        if isinstance(graphs, StreamingGraphs):
            self.streams.graphs = graphs
            if graphs.replay_ms:
                smallest, largest = min(graphs.replay_ms), max(graphs.replay_ms)
                logger.info(
                    "Kani codec stage: replays planned from measured times "
                    "(batch %d x %d frames %.1f ms ... batch %d x %d frames %.1f ms; %d timed below a smaller "
                    "batch bucket, counted at its cost)",
                    *smallest,
                    graphs.replay_ms[smallest],
                    *largest,
                    graphs.replay_ms[largest],
                    graphs.timing_inversions,
                )
        else:
            self.graphs = graphs
        device = self.decoder.device
        logger.info(
            "Kani codec stage: captured %d CUDA graphs (batch %s x frames %s) in %.1f s; torch holds %.2f GiB "
            "allocated, %.2f GiB reserved on %s",
            count,
            graphs.batch_buckets,
            graphs.frame_buckets,
            time.perf_counter() - started,
            torch.cuda.memory_allocated(device) / 2**30,
            torch.cuda.memory_reserved(device) / 2**30,
            device,
        )

    def _log_step(self, started: float, windows: list[torch.Tensor], lefts: list[int]) -> None:
        """``KANI_TRACE_CHUNKS``: one line per codec step, after its decode has finished on the device."""
        if self.decoder.device.type == "cuda":
            torch.cuda.synchronize(self.decoder.device)
        graphs = self.streams.graphs if self.streams is not None else self.graphs
        logger.info(
            "kani trace: stage1 decode windows=%s started=%.6f ms=%.2f graph_replays=%d eager_calls=%d live_streams=%d",
            [(int(w.shape[0]) - left, left) for w, left in zip(windows, lefts, strict=True)],
            started,
            (time.time() - started) * 1000,
            graphs.replays if graphs else 0,
            graphs.eager_calls if graphs else 0,
            self.streams.live if self.streams is not None else 0,
        )

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        """Free the state slots of finished and aborted requests (stateless windows hold nothing)."""
        if self.streams is not None:
            self.streams.release(finished_req_ids)

    def make_omni_output(self, model_outputs: Any, **_: Any) -> OmniOutput:
        if isinstance(model_outputs, OmniOutput):
            return model_outputs
        return OmniOutput(*model_outputs)  # the NamedTuple, unpacked in transit

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        runtime_additional_information: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> OmniOutput:
        """Decode every scheduled request's window; one 1-D waveform per request (float32, or int16 with
        ``codec_pcm16_audio``), batch order."""
        self.kernel_trace.tick()
        infos = runtime_additional_information or []
        counts = kwargs.get("seq_token_counts")
        if counts is not None:
            num_reqs = len(counts)
        elif infos:
            num_reqs = len(infos)
        else:
            num_reqs = 1 if input_ids is not None and input_ids.numel() else 0
        request_ids = kwargs.get("request_ids") or []
        slots, windows, lefts, streamed = [], [], [], []
        for i in range(num_reqs):
            info = infos[i] if i < len(infos) else None
            window = window_of(info)
            if window is None:
                continue
            codes, left = window
            try:
                check_codes(codes, self.decoder.config)
                if not 0 <= left <= codes.shape[0]:
                    raise ValueError(f"left_context_size={left} outside the {codes.shape[0]}-frame window")
            except ValueError as exc:
                logger.error("Kani codec stage: request %d of the batch has a bad window, no audio: %s", i, exc)
                continue
            seq, finished = stream_position(info)
            if self.streams is not None and seq is not None and i < len(request_ids):
                streamed.append((i, StreamChunk(str(request_ids[i]), codes[left:], seq, finished)))
                continue
            slots.append(i)
            windows.append(codes)
            lefts.append(left)
        empty = torch.empty(0, dtype=torch.float32, device=self.decoder.device)
        audio = [empty] * num_reqs
        started = time.time() if self._trace else 0.0
        if streamed:
            for (slot, _), wav in zip(streamed, self.streams.decode([c for _, c in streamed]), strict=True):
                if wav is not None:
                    audio[slot] = wav
        if windows:
            for slot, wav in zip(
                slots, self.decoder.decode_windows(windows, lefts, self.decode_max_frames, self.graphs), strict=True
            ):
                audio[slot] = wav
        if self._trace and (windows or streamed):
            self._log_step(started, windows + [c.frames for _, c in streamed], lefts + [0] * len(streamed))
        sr = torch.tensor(self.sample_rate)
        return OmniOutput(
            text_hidden_states=None,
            multimodal_outputs={
                "model_outputs": audio_to_host(audio, self.async_audio_copy, self.pcm16_audio),
                "sr": [sr] * num_reqs,
            },
        )
