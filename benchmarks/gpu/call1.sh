#!/usr/bin/env bash
# GPU call 1: environment, the 350m factory checkpoints, Stage 1 alone (eager vs graphs), the naive baseline and
# the stock LFM2 decode step (plain vLLM, no heads).
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
python3 -c "import torch, vllm, vllm_omni, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, \
'transformers', transformers.__version__)" 2>&1 | tail -1 | tee -a "$R/device.txt"
step ckpt-par 300 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m --variant parallel --force &
step ckpt-flat 300 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/flat" --preset 350m --variant flattened --force &
step codec 240 python3 benchmarks/codec_graphs.py --out "$R"
wait
ls "$CK/par" "$CK/flat" | tr '\n' ' '; echo
pack 1
step naive 150 python3 -m vllm_omni_kani.cli bench --baselines naive --ckpt "$CK/par" --out "$R" --naive-requests 8
pack 1
step stock 200 python3 -m vllm_omni_kani.benchmarks.step_time "$CK/flat" --engine vllm --label stock --out "$R" --sampled
pack 1
