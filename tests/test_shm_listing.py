"""A receiving stage polls its requests' next chunks against one listing of /dev/shm (``shm_listing.ShmListing``).

The patch (``patch.poll_shm_chunks_from_one_listing``) on a real receiving ``OmniChunkTransferAdapter``: its own
receive thread, real shared-memory chunks put by a real ``SharedMemoryConnector`` of the stage before. The serving
tests (test_serving.py and the others on ``kani_tts_cpu.yaml``) run it in the codec's engine core end to end.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from types import SimpleNamespace

from vllm_omni_kani.distributed.omni_connectors.shm_listing import SHM_DIR, ShmListing

WAIT_S = 10.0


def test_a_listing_answers_while_young_and_is_renewed_for_a_missing_name_after(tmp_path):
    (tmp_path / "a").touch()
    slow = ShmListing(str(tmp_path), max_age_s=3600.0)
    assert "a" in slow and "b" not in slow
    (tmp_path / "b").touch()
    assert "b" not in slow and slow.listings == 1  # one listing answers every lookup while it is young
    quick = ShmListing(str(tmp_path), max_age_s=0.0)
    assert "b" in quick
    (tmp_path / "c").touch()
    time.sleep(0.01)  # past the floor of four times the listing's own duration
    assert "b" in quick and quick.listings == 1  # a name it holds never lists again
    assert "c" in quick and quick.listings == 2


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def adapter(stage_id: int):
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import OmniChunkTransferAdapter

    connector_config = {"name": "SharedMemoryConnector", "extra": {"stage_id": stage_id}}
    return OmniChunkTransferAdapter(
        SimpleNamespace(
            model_config=SimpleNamespace(stage_connector_config=connector_config, stage_id=stage_id),
            scheduler_config=SimpleNamespace(max_num_seqs=8),
        )
    )


def test_polls_open_only_chunks_the_listing_names_and_take_each_in_order():
    from vllm_omni_kani import patch

    assert patch.poll_shm_chunks_from_one_listing()
    tag = f"shmlist{uuid.uuid4().hex[:8]}"
    sender, receiver = adapter(0), adapter(1)
    gets: list[str] = []
    connector_get = receiver.connector.get

    def counted_get(from_stage: str, to_stage: str, key: str, *args, **kwargs):
        gets.append(key)
        return connector_get(from_stage, to_stage, key, *args, **kwargs)

    receiver.connector.get = counted_get
    request = SimpleNamespace(request_id=f"{tag}-engine", external_req_id=f"speech-{tag}", resumable=False)
    try:
        receiver.request_ids_mapping[request.request_id] = request.external_req_id
        receiver.load_async(request)
        time.sleep(0.2)  # many passes of the receive thread with no chunk written
        assert gets == [] and request.request_id not in receiver._finished_load_reqs

        for chunk in range(3):
            key = f"speech-{tag}_0_{chunk}"
            if chunk:
                time.sleep(0.05)  # passes of the receive thread while the next chunk is not written
                assert gets == []
            assert sender.connector.put("0", "1", key, {"meta": {"finished": chunk == 2}, "chunk": chunk})[0]
            wait_for(lambda: request.request_id in receiver._finished_load_reqs, f"chunk {chunk} not received")
            assert request.additional_information["chunk"] == chunk
            # The connector is asked only for the chunk that is there: more than once where a pass lists the segment
            # between the writer creating it and sizing it (vLLM-Omni's get answers "not yet" to an empty segment).
            assert gets and set(gets) == {key}
            assert not os.path.exists(os.path.join(SHM_DIR, key))  # read and removed
            gets.clear()
            receiver._finished_load_reqs.discard(request.request_id)
            if chunk < 2:
                receiver.load_async(request)  # as the scheduler asks for the next chunk
        assert request.request_id in receiver.upstream_exhausted_requests
    finally:
        receiver.shutdown()
        sender.shutdown()
        for name in os.listdir(SHM_DIR):
            if tag in name:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(SHM_DIR, name))
