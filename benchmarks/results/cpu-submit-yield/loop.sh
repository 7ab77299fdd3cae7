#!/bin/bash
# KANI_SUBMIT_YIELD_US off against 100 us, alternating servers on the tiny CPU checkpoint, each request traced
# (KANI_TRACE_FIRST_OUTPUTS=1, bench --trace); per run /tmp/csy/RUN (copied here): the bench output and JSON, and
# first_outputs.py / first_wave.py / ttfa_breakdown.py --waves on the server log.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd /work/main || exit 1
i=0 port=18261
for side in off y100 off y100; do
  i=$((i+1)); n=$side-$i; d=/tmp/csy/$n; mkdir -p "$d"
  case $side in off) us=0 ;; y100) us=100 ;; esac
  KANI_SUBMIT_YIELD_US=$us KANI_TRACE_FIRST_OUTPUTS=1 .venv/bin/vllm serve /tmp/ck-tiny --omni \
    --deploy-config stage_configs/kani_tts_cpu.yaml --host 127.0.0.1 --port $port > "$d/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  .venv/bin/vllm-omni-kani bench --url "http://127.0.0.1:$port" --model /tmp/ck-tiny --concurrency 24 \
    --waves 4 --max-new-frames 16 --warmup 8 --trace --out "$d" --label "$n" > "$d/bench.txt" 2>&1
  kill -INT $pid; wait $pid
  for tool in first_outputs first_wave; do
    .venv/bin/python benchmarks/$tool.py "$d/serve.log" "$d/$n.json" > "$d/$tool.txt" 2>&1
  done
  .venv/bin/python benchmarks/ttfa_breakdown.py --waves "$d/serve.log" "$d/$n.json" > "$d/ttfa_breakdown.txt" 2>&1
  grep -c "submit yield" "$d/serve.log" > "$d/yield-lines.txt"
  port=$((port + 1))
done
echo loop done
