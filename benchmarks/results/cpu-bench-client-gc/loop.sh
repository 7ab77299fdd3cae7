#!/bin/bash
# Alternating client sides: before (a332f98, made with `git worktree add /tmp/wt-before a332f98`: no freeze) and
# after (this tree), the same sweeps against the tiny CPU server; results in /tmp/gcc/RUN (copied here).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
HERE=$(cd "$(dirname "$0")" && pwd)
i=0
for side in before after before after; do
  i=$((i+1)); n=$side-$i; mkdir -p /tmp/gcc/$n
  if [ $side = before ]; then root=/tmp/wt-before; else root=/work/main; fi
  (cd $root && PYTHONPATH=$root timeout 1200 /work/main/.venv/bin/python $HERE/run.py /tmp/gcc/$n/pauses.json \
    --ckpt /tmp/ck-tiny --deploy-config stage_configs/kani_tts_cpu.yaml --label $n --out /tmp/gcc/$n \
    --warmup 24 --waves 8 4:24,24 8:24 > /tmp/gcc/$n/run.log 2>&1; echo rc=$? >> /tmp/gcc/$n/run.log)
  /work/main/.venv/bin/python $HERE/analyze.py /tmp/gcc/$n/pauses.json /tmp/gcc/$n/$n-f4.json /tmp/gcc/$n/$n-f8.json > /tmp/gcc/$n/analysis.txt 2>&1
done
echo loop done
