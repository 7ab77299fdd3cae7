"""A running stream's decode step skips vLLM's slot allocation when its blocks already hold the new token.

vLLM's scheduler calls ``KVCacheManager.allocate_slots`` for every running request every step. For a Stage-0 decode
step that call frees nothing and allocates nothing 15 times in 16 (16-token attention blocks; LFM2's conv state is
one block per request), yet walks every KV-cache group to find that out: 9% of Stage 0's main thread at 256 streams
(py-spy of the served step, docs/BENCHMARKS.md, twenty-third set). ``install`` puts a check in front of it that
answers such a call as the full path would, with the manager's empty blocks, after confirming group by group that
the full path would allocate and free nothing; any other call (a prompt, a new block, prefix caching, lookahead,
a kind of group this module does not know) takes vLLM's path unchanged.

``KANI_FAST_DECODE_SLOTS=0`` (``envs.fast_decode_slots``) leaves vLLM's path alone (the A/B switch).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager
from vllm.v1.request import RequestStatus

from vllm_omni_kani.envs import fast_decode_slots

logger = logging.getLogger(__name__)


def _known_managers(manager: KVCacheManager) -> list[Any] | None:
    """The manager's per-group managers when every one is a kind whose decode step the check understands: full
    attention, or a Mamba-family state without prefix-cache alignment or speculative blocks."""
    groups = getattr(manager.coordinator, "single_type_managers", None)
    if not groups:
        return None
    for group in groups:
        if type(group) is FullAttentionManager:
            continue
        if type(group) is MambaManager and group.mamba_cache_mode != "align" and group.num_speculative_blocks == 0:
            continue
        return None
    return list(groups)


def install(manager: KVCacheManager) -> bool:
    """Put the decode check in front of ``manager.allocate_slots``; False (and nothing changed) where it cannot
    apply: prefix caching on (the full path then caches blocks), or a group kind it does not know."""
    groups = _known_managers(manager)
    if manager.enable_caching or groups is None:
        return False
    full_path = manager.allocate_slots
    max_model_len = manager.max_model_len
    empty = manager.empty_kv_cache_blocks

    def allocate_slots(
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> Any:
        if (
            num_new_tokens == 1
            and request.status == RequestStatus.RUNNING
            and not (num_new_computed_tokens or num_lookahead_tokens or num_external_computed_tokens)
            and not (num_encoder_tokens or reserved_blocks or full_sequence_must_fit)
            and new_computed_blocks is None
        ):
            computed = min(request.num_computed_tokens, max_model_len)
            needed = min(computed + 1, max_model_len)
            processed = max(0, computed - request.num_in_flight_tokens)
            rid = request.request_id
            for group in groups:
                blocks = group.req_to_blocks.get(rid)
                if not blocks or len(blocks) * group.block_size < needed or rid in group._partial_hit_reqs:
                    break  # a new block (or a copy) to allocate
                if group.get_num_skipped_tokens(processed) >= group.block_size:
                    break  # a whole block behind a window to free
            else:
                return empty
        return full_path(
            request,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=has_scheduled_reqs,
        )

    manager.allocate_slots = allocate_slots  # type: ignore[method-assign]
    return True


class FastDecodeSlots:
    """Scheduler mixin: the decode check on the scheduler's KV-cache manager (unless ``KANI_FAST_DECODE_SLOTS=0``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        installed = fast_decode_slots() and install(self.kv_cache_manager)
        logger.info("Kani Stage-0 scheduler: decode steps %s vLLM's slot allocation", "skip" if installed else "take")
