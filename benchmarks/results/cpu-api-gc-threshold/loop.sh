#!/bin/bash
# The API server's collector thresholds, CPython's (700, 10, 10) against KANI_MAIN_GC_THRESHOLD=20000, alternating
# servers on the tiny CPU checkpoint; each side's server log and bench output in /tmp/gct/RUN (copied here).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd /work/main || exit 1
i=0 port=18231
for side in default t20000 default t20000; do
  i=$((i+1)); n=$side-$i; d=/tmp/gct/$n; mkdir -p "$d"
  env_side=""; [ "$side" = t20000 ] && env_side="KANI_MAIN_GC_THRESHOLD=20000"
  # shellcheck disable=SC2086
  env KANI_LOOP_LAG_S=5 $env_side .venv/bin/vllm serve /tmp/ck-tiny --omni \
    --deploy-config stage_configs/kani_tts_cpu.yaml --host 127.0.0.1 --port $port > "$d/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  .venv/bin/vllm-omni-kani bench --url "http://127.0.0.1:$port" --model /tmp/ck-tiny --concurrency 24,24 \
    --waves 8 --max-new-frames 16 --warmup 24 --out "$d" --label "$n" > "$d/bench.txt" 2>&1
  kill -INT $pid; wait $pid
  grep -h "kani api gc:\|KANI_MAIN_GC_THRESHOLD" "$d/serve.log" > "$d/api-gc.log"
  .venv/bin/python benchmarks/loop_stalls.py "$d/api-gc.log" > "$d/summary.txt"
  port=$((port + 1))
done
echo loop done
