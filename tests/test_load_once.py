"""The API server's lazily built values (tokenizer, speaker model) load once under a burst of first requests."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from vllm_omni_kani.entrypoints.openai.load_once import LoadOnce
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

BURST = 32


def test_a_burst_of_first_requests_loads_the_tokenizer_once(tiny_parallel: Path):
    """As the adapter does: every request tokenizes in an executor thread, the first ones while the load runs."""
    calls = []

    def load():
        calls.append(1)
        return AutoTokenizer.from_pretrained(str(tiny_parallel))

    tokenizer = LoadOnce(load)

    async def burst() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            return await asyncio.gather(
                *(
                    loop.run_in_executor(pool, lambda i=i: tl.text_prompt_ids(tokenizer.get(), f"hello {i}", None))
                    for i in range(BURST)
                )
            )

    prompts = asyncio.run(burst())
    assert len(calls) == 1 and tokenizer.loaded
    # Every request got its own text's prompt from the one tokenizer.
    assert len({tuple(p) for p in prompts}) == BURST
    assert prompts[3] == tl.text_prompt_ids(tokenizer.get(), "hello 3", None)


def test_a_failed_load_is_retried_by_the_next_caller(tmp_path: Path):
    source = tmp_path / "value.txt"
    reads = []

    def read() -> str:
        reads.append(1)
        return source.read_text()

    loader = LoadOnce(read)
    with pytest.raises(FileNotFoundError):
        loader.get()
    assert not loader.loaded and len(reads) == 1
    source.write_text("ready")
    assert loader.get() == "ready" and loader.get() == "ready"
    assert loader.loaded and len(reads) == 2  # the failed read, then one that loaded
