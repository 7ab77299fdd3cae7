#!/bin/bash
# usage: run.sh LABEL [KANI_DISABLE_PATCHES value]: a traced sweep with the first-output trace, then first_outputs.py
cd /work/main
label=$1; dis=$2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 KANI_TRACE_FIRST_OUTPUTS=1
[ -n "$dis" ] && export KANI_DISABLE_PATCHES=$dis
setsid .venv/bin/vllm serve /tmp/ck-tiny --omni --deploy-config stage_configs/kani_tts_cpu.yaml --host 127.0.0.1 --port 18123 --stage-init-timeout 900 > /tmp/ab3/$label.log 2>&1 &
spid=$!
for i in $(seq 1 400); do curl -sf http://127.0.0.1:18123/health >/dev/null && break; sleep 1; done
sleep 15
.venv/bin/vllm-omni-kani bench --url http://127.0.0.1:18123 --model /tmp/ck-tiny --concurrency 8 --waves 4 --max-new-frames 16 --warmup 1 --trace --out /tmp/ab3/tr --label $label > /tmp/ab3/$label-bench.txt 2>&1
kill -INT -- -$spid; sleep 8; kill -9 -- -$spid 2>/dev/null; sleep 3
.venv/bin/python benchmarks/first_outputs.py /tmp/ab3/$label.log /tmp/ab3/tr/$label.json > /tmp/ab3/$label-first-outputs.txt 2>&1
echo done $label
