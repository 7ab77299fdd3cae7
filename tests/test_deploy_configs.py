"""Every shipped deploy YAML resolves through vLLM-Omni's own loader, and the replica layouts place what they say.

The GPU files cannot be served on CPU CI, so a broken ``base_config`` chain, a stage that does not parse or a device
list that does not split into replicas would only show on a GPU machine. vLLM-Omni's ``load_deploy_config`` (the
one ``vllm serve --omni --deploy-config`` uses) and ``split_devices_for_replicas`` (what the stage launcher hands
each replica) read them here exactly as they do there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_omni.config.stage_config import load_deploy_config, resolve_deploy_yaml
from vllm_omni.engine.stage_init_utils import split_devices_for_replicas

from tests.server_utils import STAGE_CONFIGS
from vllm_omni_kani.model_executor.models.kani_tts.pipeline import LM_ONLY_PIPELINE_KEY, PIPELINE_KEY

DEPLOY_FILES = sorted(STAGE_CONFIGS.glob("*.yaml"))


def _stage(path: Path, stage_id: int):
    return next(s for s in load_deploy_config(path).stages if s.stage_id == stage_id)


def _replica_devices(path: Path, stage_id: int) -> list[str]:
    stage = _stage(path, stage_id)
    return split_devices_for_replicas(stage.devices, stage.num_replicas, 1, stage_id)


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=[p.name for p in DEPLOY_FILES])
def test_every_deploy_file_loads_as_a_kani_pipeline(path):
    config = load_deploy_config(path)
    stage_ids = {PIPELINE_KEY: {0, 1}, LM_ONLY_PIPELINE_KEY: {0}}[config.pipeline]
    assert {s.stage_id for s in config.stages} == stage_ids
    for stage in config.stages:
        if stage.num_replicas > 1:  # one device list entry per replica (a single engine may leave it unset)
            assert len(_replica_devices(path, stage.stage_id)) == stage.num_replicas


def test_the_shipped_file_runs_two_stage0_engines_and_one_codec_on_gpu_0():
    path = STAGE_CONFIGS / "kani_tts.yaml"
    assert _replica_devices(path, 0) == ["0", "0"]
    assert _stage(path, 1).num_replicas == 1 and _stage(path, 1).devices == "0"


def test_one_lm_changes_nothing_else_of_the_shipped_file():
    """The measured difference (docs/BENCHMARKS.md, thirteenth and thirtieth to thirty-second sets) is the Stage-0
    replica count alone."""
    shipped = resolve_deploy_yaml(STAGE_CONFIGS / "kani_tts.yaml")
    one = resolve_deploy_yaml(STAGE_CONFIGS / "kani_tts_one_lm.yaml")
    stage0 = dict(one["stages"][0])
    assert (stage0.pop("num_replicas"), stage0.pop("devices")) == (1, "0")
    assert stage0 == {k: v for k, v in shipped["stages"][0].items() if k not in ("num_replicas", "devices")}
    assert one["stages"][1] == shipped["stages"][1]
    assert {k: v for k, v in one.items() if k != "stages"} == {k: v for k, v in shipped.items() if k != "stages"}


@pytest.mark.parametrize("name", ["kani_tts_codec_replicas.yaml", "kani_tts_multinode.yaml"])
def test_codec_replica_files_keep_one_stage0_engine(name):
    """Files that place Stage 0 on one device set one engine there; the shipped file's two would not split over it."""
    stage0 = _stage(STAGE_CONFIGS / name, 0)
    assert (stage0.num_replicas, stage0.devices) == (1, "0")


def test_multinode_repeats_the_shipped_chunk_policy():
    """Its ``connectors:`` block replaces the base file's whole (a Mooncake connector), so the chunk schedule is
    repeated there; a change to the shipped schedule (docs/BENCHMARKS.md, fifty-second set) must reach it too."""
    from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import ChunkPolicy

    shipped = resolve_deploy_yaml(STAGE_CONFIGS / "kani_tts.yaml")["connectors"]["shm"]["extra"]
    multinode = next(iter(resolve_deploy_yaml(STAGE_CONFIGS / "kani_tts_multinode.yaml")["connectors"].values()))
    assert ChunkPolicy.from_extra(multinode["extra"]) == ChunkPolicy.from_extra(shipped)


def _vllm_default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM 0.26's own sizes for a decode-only batch limit (its ``_set_cudagraph_sizes``, no speculation)."""
    top = min(2 * max_num_seqs, 512)
    return sorted({s for s in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)) if s <= top})


@pytest.mark.parametrize("name", ["kani_tts.yaml", "kani_tts_2gpu.yaml"])
def test_stage0_captures_mixed_batches_past_vllms_default(name):
    """Stage 0's graph sizes keep every size vLLM would capture (decode batches replay as before) and go on to 2,048
    tokens, inside the step's token budget, so a step admitting prompts beside running streams replays graphs too."""
    stage0 = _stage(STAGE_CONFIGS / name, 0)
    sizes = stage0.compilation_config["cudagraph_capture_sizes"]
    assert sizes == sorted(set(sizes))
    assert set(_vllm_default_capture_sizes(stage0.max_num_seqs)) <= set(sizes)
    assert max(sizes) == 2048 <= stage0.max_num_batched_tokens


def test_every_file_based_on_the_shipped_one_inherits_its_stage0_graph_sizes():
    shipped = resolve_deploy_yaml(STAGE_CONFIGS / "kani_tts.yaml")["stages"][0]["compilation_config"]
    for path in DEPLOY_FILES:
        text = path.read_text()
        if "base_config: kani_tts.yaml" in text:
            assert _stage(path, 0).compilation_config == shipped, path.name


def test_the_shipped_stage0_admits_every_8th_step_under_load_and_its_children_inherit_it():
    """The cadence measured in the forty-ninth set (docs/BENCHMARKS.md), read by the scheduler's own parser: fixed, not
    following the load (rows_per_step 0)."""
    from types import SimpleNamespace

    from vllm_omni_kani.core.sched.admission_cadence import admission_cadence

    for path in [STAGE_CONFIGS / "kani_tts.yaml"] + [
        p for p in DEPLOY_FILES if "base_config: kani_tts.yaml" in p.read_text()
    ]:
        stage0 = _stage(path, 0)
        extra = stage0.engine_extras.get("additional_config")  # vLLM-Omni passes it through to the engine args
        assert admission_cadence(SimpleNamespace(additional_config=extra)) == (8, 64, 0), path.name
