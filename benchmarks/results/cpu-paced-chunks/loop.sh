#!/bin/bash
# Paced chunks on the CPU: kani_tts_cpu.yaml (3, then 16 frames a chunk) against the same with codec_chunk_lead_ms 100,
# alternating servers on the tiny checkpoint, every request traced and every chunk logged (KANI_TRACE_CHUNKS=1: the
# `paced=` of each); per run /tmp/cpc/RUN (copied here): the bench output and JSON, the server log, stalls.py.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd /work/main || exit 1
[ -d /tmp/ck-tiny ] || .venv/bin/vllm-omni-kani make-checkpoint --preset tiny /tmp/ck-tiny
.venv/bin/python -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts_cpu.yaml /tmp/cpc/lead100.yaml \
  connectors.shm.extra.codec_chunk_lead_ms=100
i=0 port=18361
for side in fixed lead100 fixed lead100; do
  i=$((i+1)); n=$side-$i; d=/tmp/cpc/$n; mkdir -p "$d"
  case $side in fixed) yaml=stage_configs/kani_tts_cpu.yaml ;; lead100) yaml=/tmp/cpc/lead100.yaml ;; esac
  KANI_TRACE_CHUNKS=1 .venv/bin/vllm serve /tmp/ck-tiny --omni --deploy-config "$yaml" --host 127.0.0.1 \
    --port $port > "$d/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  .venv/bin/vllm-omni-kani bench --url "http://127.0.0.1:$port" --model /tmp/ck-tiny --concurrency "${LEVELS:-2,4}" \
    --waves 4 --max-new-frames 64 --warmup 4 --trace --out "$d" --label "$n" > "$d/bench.txt" 2>&1
  kill -INT $pid; wait $pid
  PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/stalls.py "$d/$n.json" > "$d/stalls.txt" 2>&1
  echo "$(grep -c 'stage0 emit.*paced=True' "$d/serve.log") paced of $(grep -c 'stage0 emit' "$d/serve.log") chunks" \
    > "$d/paced.txt"
  gzip -f "$d/serve.log"
  port=$((port + 1))
done
echo loop done
