"""/dev/shm stays bounded: mass cancels and cut streams leave none of the connector's files behind.

Stage 0 hands every async_chunk window to Stage 1 through vLLM-Omni's ``SharedMemoryConnector``: one POSIX segment
``/dev/shm/<engine request id>_0_<chunk>`` and one empty ``/dev/shm/shm_<same key>_lockfile.lock`` per chunk, removed
only when Stage 1 reads the chunk. The chunks of an aborted request that Stage 1 had not read yet were left there for
good (docs/RELIABILITY.md, "Shared-memory chunks of aborted requests are never removed");
``patch.unlink_shm_chunks_of_aborted_requests`` removes them.

Unread chunks pile up when Stage 1 runs behind Stage 0, as it does under load. On this box the codec keeps up with
the tiny checkpoint, so the test makes the lag itself: Stage 1's engine core is paused (SIGSTOP) while a backlog
builds, and the streams are cut and cancelled while it is still paused. The same server as test_reliability.py and
test_serving.py (one start for all of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from types import SimpleNamespace

import httpx
import psutil
import pytest

from vllm_omni_kani.entrypoints.openai.metrics import sample_value
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME

pytestmark = [pytest.mark.server, pytest.mark.engine]

DEPLOY = "kani_tts_cpu.yaml"
SHM = "/dev/shm"
TEXT = "Hello world, this is Kani speaking."
BODY = {"input": TEXT, "temperature": 0.0, "response_format": "pcm", "stream_format": "audio"}
# Greedy, so the random weights never end a request early. A long request is still generating when it is ended; a
# short one (4 chunks) has usually left Stage 0 by then, with chunks Stage 1 has not read. None runs to its end.
LONG_FRAMES, SHORT_FRAMES = 400, 40
WAVES = 7  # x the admission limit (32 on kani_tts_cpu.yaml): 224 streams
RUNNING = 8  # Stage 0's max_num_seqs in kani_tts_cpu.yaml: the rest of a wave waits in its queue
BACKLOG = 3 * RUNNING  # unread chunks in /dev/shm when a wave is ended


def test_an_abort_removes_exactly_that_requests_unread_chunks():
    """The patch on a real sending adapter (its save thread and real segments), without a server.

    Only the aborted request's own keys go: not those of ids that extend it or contain it, nor its keys of another
    stage; a chunk the next stage has already read is simply gone.
    """
    from vllm.v1.request import RequestStatus
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import OmniChunkTransferAdapter

    from vllm_omni_kani import patch

    assert patch.unlink_shm_chunks_of_aborted_requests()
    tag = f"shmunit{uuid.uuid4().hex[:8]}"
    connector_config = {"name": "SharedMemoryConnector", "extra": {"stage_id": 0}}
    adapter = OmniChunkTransferAdapter(
        SimpleNamespace(
            model_config=SimpleNamespace(stage_connector_config=connector_config),
            scheduler_config=SimpleNamespace(max_num_seqs=8),
        )
    )
    try:
        aborted, live = f"speech-{tag}-a", [f"speech-{tag}-a-2", f"speech-{tag}-a_0", f"speech-{tag}-b"]
        keys = [f"{aborted}_0_{chunk}" for chunk in range(3)] + [f"{aborted}_1_0"]
        keys += [f"{ext}_0_{chunk}" for ext in live for chunk in range(2)]
        for key in keys:
            assert adapter.connector.put("0", "1", key, {"chunk": key})[0]
        assert adapter.connector.get("0", "1", f"{aborted}_0_0")[0] == {"chunk": f"{aborted}_0_0"}  # read
        adapter.request_payload[aborted] = {"kani_tts": "the producer's state"}

        kept = [key for key in keys if key not in {f"{aborted}_0_{chunk}" for chunk in range(3)}]
        files = {*kept, *(f"shm_{key}_lockfile.lock" for key in kept)}

        adapter.finish_requests([aborted], RequestStatus.FINISHED_ABORTED, {})
        deadline = time.monotonic() + 10
        while connector_files(tag) - files:
            assert time.monotonic() < deadline, sorted(connector_files(tag) - files)
            time.sleep(0.02)
        time.sleep(0.1)  # the job's last step: the sender-side state
        assert connector_files(tag) == files
        assert aborted not in adapter.request_payload
    finally:
        adapter.shutdown()  # the connector unlinks what it still tracks
        for name in connector_files(tag):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(SHM, name))


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    return omni_server(tiny_parallel, DEPLOY)


def connector_files(tag: str) -> set[str]:
    """The connector's chunk segments and lock files in /dev/shm of requests whose X-Request-Id starts with ``tag``.

    Keys are ``<external request id>_<stage>_<chunk>``, and the engine names a speech request ``speech-<X-Request-Id>``
    plus 8 hex digits; the tag keeps other servers on the same machine out of the count.
    """
    key = rf"speech-{re.escape(tag)}-[^/]*_\d+_\d+"
    pattern = re.compile(rf"{key}|shm_{key}_lockfile\.lock")
    return {name for name in os.listdir(SHM) if pattern.fullmatch(name)}


def stage_engine_core(server, stage_id: int) -> psutil.Process:
    """The engine-core process of one stage (it runs the stage's scheduler and its connector)."""
    for process in psutil.Process(server.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if f"StageEngineCoreProc_stage{stage_id}_" in " ".join(process.cmdline()):
                return process
    raise AssertionError(f"no engine core of stage {stage_id} under the server")


def gauges(client: httpx.Client, base_url: str) -> tuple[float | None, float | None]:
    text = client.get(f"{base_url}/metrics", timeout=60).text
    return sample_value(text, "kani:speech_requests_active"), sample_value(text, "kani:speech_requests_queued")


def wait_idle(client: httpx.Client, base_url: str, timeout_s: float = 60.0) -> None:
    """Until the admission gauges say no speech request is active or queued."""
    deadline = time.monotonic() + timeout_s
    while (now := gauges(client, base_url)) != (0, 0):
        assert time.monotonic() < deadline, f"speech requests active, queued after {timeout_s} s: {now}"
        time.sleep(0.2)


async def _wave(base_url: str, tag: str, wave: int, size: int, stage1: psutil.Process) -> dict[str, int]:
    """``size`` streams at once: the first RUNNING play, the others wait in Stage 0's queue; then all end together.

    Even-numbered streams are cut by the client, odd-numbered ones cancelled by id: running ones after their first
    audio, once Stage 1 has fallen BACKLOG chunks behind; queued ones on their headers. Returns each stream's status.
    """
    statuses: dict[str, int] = {}
    go = asyncio.Event()
    limits = httpx.Limits(max_connections=2 * size + 4, max_keepalive_connections=2 * size + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int, ready: asyncio.Event) -> None:
            request_id = f"{tag}-{wave}-{i}"
            body = {**BODY, "max_new_tokens": SHORT_FRAMES if i % 4 >= 2 else LONG_FRAMES}
            headers = {"X-Request-Id": request_id}
            async with client.stream("POST", f"{base_url}/v1/audio/speech", json=body, headers=headers) as r:
                statuses[request_id] = r.status_code
                chunks = r.aiter_bytes()
                try:
                    if r.status_code == 200 and i < RUNNING:
                        await anext(chunks)  # its first audio: it runs in both stages
                finally:
                    ready.set()
                await go.wait()
                if r.status_code != 200 or i % 2 == 0:
                    return  # cut: leaving the block closes the connection mid-stream
                cancel = await client.post(f"{base_url}/v1/audio/speech/{request_id}/cancel")
                assert cancel.status_code == 200, cancel.text
                async for _ in chunks:  # the stream ends cleanly after the cancel
                    pass

        async def start(indices: range) -> list[asyncio.Task]:
            ready = {i: asyncio.Event() for i in indices}
            tasks = [asyncio.create_task(one(i, ready[i])) for i in indices]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready.values())), 120)
            return tasks

        tasks = await start(range(RUNNING))
        tasks += await start(range(RUNNING, size))
        stage1.suspend()
        try:
            deadline = time.monotonic() + 60
            while len({n for n in connector_files(f"{tag}-{wave}") if not n.endswith(".lock")}) < BACKLOG:
                assert time.monotonic() < deadline, "Stage 0 sent no chunks while Stage 1 was paused"
                await asyncio.sleep(0.05)
            go.set()
            await asyncio.sleep(0.3)  # the cuts and cancels reach both stages before Stage 1 can catch up
        finally:
            stage1.resume()
        await asyncio.gather(*tasks)
    return statuses


def test_mass_cancels_and_cut_streams_leave_no_connector_files_in_dev_shm(server, record_property):
    tag = f"shm{uuid.uuid4().hex[:8]}"
    before = set(os.listdir(SHM))
    stage1 = stage_engine_core(server, 1)
    started = time.monotonic()
    with httpx.Client(timeout=60) as client:
        wait_idle(client, server.base_url)
        limit = int(sample_value(client.get(f"{server.base_url}/metrics").text, "kani:speech_max_concurrent_requests"))
        statuses: dict[str, int] = {}
        for wave in range(WAVES):
            statuses |= asyncio.run(_wave(server.base_url, tag, wave, limit, stage1))
            wait_idle(client, server.base_url)  # every slot free before the next wave (else: 503)
        record_property("streams", len(statuses))
        record_property("waves_s", round(time.monotonic() - started, 1))
        assert len(statuses) >= 200 and set(statuses.values()) == {200}, statuses
        # A request afterwards: it completes, and it leaves nothing behind either.
        r = client.post(
            f"{server.base_url}/v1/audio/speech",
            json={"input": TEXT, "max_new_tokens": 5, "temperature": 0.0, "response_format": "pcm"},
            headers={"X-Request-Id": f"{tag}-after"},
            timeout=120,
        )
        assert r.status_code == 200 and len(r.content) == 5 * SAMPLES_PER_FRAME * 2

    # The aborts reach the engines asynchronously: give them a moment, then nothing of these requests may remain.
    deadline = time.monotonic() + 15
    while (left := connector_files(tag) - before) and time.monotonic() < deadline:
        time.sleep(0.25)
    locks = sorted(name for name in left if name.endswith("_lockfile.lock"))
    segments = sorted(left - set(locks))
    record_property("left_lock_files", len(locks))
    record_property("left_segments", len(segments))
    assert not left, f"{len(locks)} lock files and {len(segments)} segments left in {SHM}, e.g. {sorted(left)[:6]}"
