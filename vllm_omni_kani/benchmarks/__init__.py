"""Benchmarks of the served pipeline (``vllm-omni-kani bench``) and of the baselines it is measured against."""
