#!/usr/bin/env bash
# GPU call 2: served sweeps and the end-to-end check. Every server variant starts at once (startup is mostly
# CPU-bound compile and graph capture; each has an explicit KV budget, so they share the GPU safely), then each
# is swept alone while the others sit idle. Variants differ from stage_configs/kani_tts.yaml in one knob each.
# As run, two of six became healthy within 420 s: vLLM-Omni initialises stages on one GPU one at a time (and the
# flattened server hit an adapter bug since fixed). Start servers one after another (call5.sh) instead.
source benchmarks/gpu/common.sh
Y=/tmp/kani-yaml; mkdir -p "$Y"
KV=stages.0.kv_cache_memory_bytes=2147483648  # variants: 2 GiB holds 256 x 150 tokens many times over
V() { python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml "$Y/$1.yaml" "${@:2}" > /dev/null; }
V main
V noasync $KV stages.0.async_scheduling=false
V eager $KV stages.0.enforce_eager=true 'stages.1.additional_config.codec_cudagraph_batch_sizes=[]'
V chunks-i2-c8 $KV connectors.shm.extra.initial_codec_chunk_frames=2 connectors.shm.extra.codec_chunk_frames=8
V chunks-i4-c48 $KV connectors.shm.extra.initial_codec_chunk_frames=4 connectors.shm.extra.codec_chunk_frames=48
cp "$Y"/*.yaml "$R/"
python3 - "$Y" "$CK" <<'PY'
# Start every server (each with its own vLLM compile cache: no two write one directory), record url/pid/startup.
import json, sys, threading, time
from pathlib import Path
from vllm_omni_kani.benchmarks.server import Server
y, ck = Path(sys.argv[1]), sys.argv[2]
plan = {"main": ("par", "main"), "flattened": ("flat", "main"), "noasync": ("par", "noasync"),
        "eager": ("par", "eager"), "chunks-i2-c8": ("par", "chunks-i2-c8"), "chunks-i4-c48": ("par", "chunks-i4-c48")}
state = {}
def start(name, ckpt, yaml):
    s = Server(f"{ck}/{ckpt}", str(y / f"{yaml}.yaml"), Path(f"/tmp/kani-results/serve-{name}.log"),
               env={"VLLM_CACHE_ROOT": f"/tmp/vllm-cache-{name}"})
    try:
        s.start(timeout_s=420)
        state[name] = {"url": s.url, "pid": s.proc.pid, "startup_s": s.startup_s, "model": s.ckpt}
    except Exception as exc:
        state[name] = {"error": str(exc)}
        s.stop()
    Path("/tmp/kani-servers.json").write_text(json.dumps(state))
threads = []
for name, (ckpt, yaml) in plan.items():
    threads.append(threading.Thread(target=start, args=(name, ckpt, yaml)))
    threads[-1].start()
    time.sleep(2)
for t in threads:
    t.join()
print("servers:", {k: (round(v["startup_s"]) if "url" in v else v["error"]) for k, v in state.items()}, flush=True)
PY
srv() { python3 -c "import json; print(json.load(open('/tmp/kani-servers.json')).get('$1', {}).get('$2', ''))"; }
sweep() {  # sweep NAME LEVELS: the e2e check, then the concurrency sweep; then that server is stopped
  local name=$1 levels=$2
  if [ "$SECONDS" -gt 500 ]; then echo "[$name] skipped: out of time"; return; fi
  local url; url=$(srv "$name" url)
  if [ -z "$url" ]; then echo "[$name] no server: $(srv "$name" error)"; return; fi
  step "bench-$name" 200 python3 -m vllm_omni_kani.cli bench --url "$url" --model "$(srv "$name" model)" \
    --label "$name" --concurrency "$levels" --out "$R" --e2e --deploy-config-note "$name"
  kill -TERM -- -"$(srv "$name" pid)" 2>/dev/null
  pack 2
}
sweep main 1,10,50,64,100,128,256
sweep flattened 1,10,50,100,256
sweep eager 1,64,256
sweep noasync 1,64,256
sweep chunks-i2-c8 1,64,256
sweep chunks-i4-c48 1,64,256
python3 - <<'PY'
import json
d = json.load(open("/tmp/kani-servers.json"))
rows = [{"server": k, "startup_s": v.get("startup_s"), "error": (v.get("error") or "")[:80]} for k, v in d.items()]
open("/tmp/kani-results/server_startup.json", "w").write(json.dumps({"kind": "startup", "label": "server-startup", "rows": rows}))
PY
for name in main flattened eager noasync chunks-i2-c8 chunks-i4-c48; do
  p=$(srv "$name" pid); [ -n "$p" ] && kill -9 -- -"$p" 2>/dev/null
done
pack 2
