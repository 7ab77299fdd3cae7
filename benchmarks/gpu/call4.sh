#!/usr/bin/env bash
# GPU call 4 (a fresh machine, after staging): checkpoints, then four servers (vLLM-Omni serializes stage
# initialisation on one GPU, so four start in about the time of their stage inits in a row), each swept alone:
# the shipped kani_tts.yaml, the flattened baseline on it, Stage 0 eager + codec eager, and async scheduling off.
# As run, only the first became healthy within 330 s: start servers in sequence instead.
source benchmarks/gpu/common.sh
step ckpt-par 120 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/par" --preset 350m --variant parallel --force &
step ckpt-flat 120 python3 -m vllm_omni_kani.tools.make_checkpoint "$CK/flat" --preset 350m --variant flattened --force &
wait
Y=/tmp/kani-yaml; mkdir -p "$Y"
KV=stages.0.kv_cache_memory_bytes=2147483648
V() { python3 -m vllm_omni_kani.benchmarks.variants stage_configs/kani_tts.yaml "$Y/$1.yaml" "${@:2}" > /dev/null; }
V main
V noasync $KV stages.0.async_scheduling=false
V eager $KV stages.0.enforce_eager=true 'stages.1.additional_config.codec_cudagraph_batch_sizes=[]'
cp "$Y"/*.yaml "$R/"
python3 - "$Y" "$CK" <<'PY'
import json, sys, threading, time
from pathlib import Path
from vllm_omni_kani.benchmarks.server import Server
y, ck = Path(sys.argv[1]), sys.argv[2]
plan = {"main": ("par", "main"), "flattened": ("flat", "main"), "eager": ("par", "eager"), "noasync": ("par", "noasync")}
state = {}
def start(name, ckpt, yaml):
    s = Server(f"{ck}/{ckpt}", str(y / f"{yaml}.yaml"), Path(f"/tmp/kani-results/serve-{name}.log"),
               env={"VLLM_CACHE_ROOT": f"/tmp/vllm-cache-{name}"})
    try:
        s.start(timeout_s=330)
        state[name] = {"url": s.url, "pid": s.proc.pid, "startup_s": s.startup_s, "model": s.ckpt}
    except Exception as exc:
        state[name] = {"error": str(exc)}
        s.stop()
    Path("/tmp/kani-servers.json").write_text(json.dumps(state))
threads = []
for name, (ckpt, yaml) in plan.items():
    threads.append(threading.Thread(target=start, args=(name, ckpt, yaml)))
    threads[-1].start()
    time.sleep(3)
for t in threads:
    t.join()
print("servers:", {k: (round(v["startup_s"]) if "url" in v else v["error"]) for k, v in state.items()}, flush=True)
PY
srv() { python3 -c "import json; print(json.load(open('/tmp/kani-servers.json')).get('$1', {}).get('$2', ''))"; }
sweep() {
  local name=$1 levels=$2
  if [ "$SECONDS" -gt "${3:-500}" ]; then echo "[$name] skipped: out of time"; return; fi
  local url; url=$(srv "$name" url)
  if [ -z "$url" ]; then echo "[$name] no server: $(srv "$name" error)"; return; fi
  step "bench-$name" 150 python3 -m vllm_omni_kani.cli bench --url "$url" --model "$(srv "$name" model)" \
    --label "$name" --concurrency "$levels" --out "$R" --e2e --deploy-config-note "$name"
  kill -TERM -- -"$(srv "$name" pid)" 2>/dev/null
  pack 4
}
sweep main 1,10,50,64,100,128,256 470
sweep flattened 1,64,256 480
sweep eager 1,64,256 500
sweep noasync 1,64,256 510
python3 - <<'PY'
import json
d = json.load(open("/tmp/kani-servers.json"))
rows = [{"server": k, "startup_s": v.get("startup_s"), "error": (v.get("error") or "")[:80]} for k, v in d.items()]
open("/tmp/kani-results/server_startup.json", "w").write(json.dumps({"kind": "startup", "label": "server-startup", "rows": rows}))
PY
for name in main flattened eager noasync; do p=$(srv "$name" pid); [ -n "$p" ] && kill -9 -- -"$p" 2>/dev/null; done
pack 4
