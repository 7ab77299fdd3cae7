#!/usr/bin/env bash
# GPU call 11 (nvidia-h200-x2, right after the last staging part unpacks): the 350m factory checkpoints and the
# deploy-YAML variants for calls 12 and 13 (as call 6; /tmp stays while the machine is held).
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$R/device-2gpu.txt"
python3 -c "import torch, vllm, vllm_omni, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, \
'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())" 2>&1 | tail -1 | tee -a "$R/device-2gpu.txt"
step ckpt-par 150 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m --variant parallel --force &
step ckpt-flat 150 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/flat" --preset 350m --variant flattened --force &
wait
Y=/tmp/kani-yaml; mkdir -p "$Y"
V() { python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml "$Y/$1.yaml" "${@:2}"; }
V no-ramp connectors.shm.extra.max_codec_chunk_frames=16
cp "$Y"/*.yaml "$R/"
pack 11
