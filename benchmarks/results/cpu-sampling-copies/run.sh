#!/bin/bash
# The API server's CPU per request over waves of one-frame requests (the intake and the finish, almost no streaming),
# for the package in TREE (default /work/main; PYTHONPATH puts it before the installed one): `TREE=DIR run.sh LABEL
# [ENV=VALUE ...]` serves the tiny checkpoint on this CPU machine, sends one warm-up sweep, then WAVES waves of CONC
# (32: the CPU file's admission limit) requests one after another (py-spy as well unless NO_SPY is set), and writes
# per thread the CPU seconds the waves cost it (/proc, psutil) to /tmp/csc/LABEL/cpu.json.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
label=$1; shift
cd "${TREE:-/work/main}" || exit 1
d=/tmp/csc/$label; mkdir -p "$d"
port=${PORT:-18301} waves=${WAVES:-8}
env PYTHONPATH="$PWD" "$@" /work/main/.venv/bin/vllm serve /tmp/ck-tiny --omni --deploy-config stage_configs/kani_tts_cpu.yaml \
  --host 127.0.0.1 --port "$port" > "$d/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.5; done
bench() {
  /work/main/.venv/bin/vllm-omni-kani bench --url "http://127.0.0.1:$port" --model /tmp/ck-tiny --concurrency "${CONC:-32}" --waves 1 \
    --max-new-frames 1 --warmup 0 --out "$d" --label "$1" > "$d/bench-$1.txt" 2>&1
}
bench warm
/work/main/.venv/bin/python - "$pid" > "$d/cpu-before.json" << 'PY'
import json, sys, psutil
print(json.dumps({t.id: t.user_time + t.system_time for t in psutil.Process(int(sys.argv[1])).threads()}))
PY
if [ -z "${NO_SPY:-}" ]; then
  /tmp/pyspy/bin/py-spy record -p "$pid" --threads --gil --nonblocking -r 500 -f raw -o "$d/spy.txt" -d 600 \
    > "$d/spy.log" 2>&1 &
  spy=$!
  sleep 1
fi
start=$(date +%s.%N)
for i in $(seq "$waves"); do bench "w$i"; done
end=$(date +%s.%N)
[ -n "${spy:-}" ] && { kill -INT "$spy"; wait "$spy"; }
/work/main/.venv/bin/python - "$pid" "$d" "$start" "$end" << 'PY'
import json, sys, glob, psutil
pid, d, start, end = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
before = {int(k): v for k, v in json.load(open(f"{d}/cpu-before.json")).items()}
names = {}
for t in psutil.Process(pid).threads():
    try:
        names[t.id] = open(f"/proc/{pid}/task/{t.id}/comm").read().strip()
    except OSError:
        names[t.id] = "?"
after = {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
reqs = errs = 0
for f in glob.glob(f"{d}/w[0-9]*.json"):
    for level in json.load(open(f))["levels"]:
        reqs += level["requests"]; errs += level["errors"]
spent = {f"{names[t]} ({t})": round(after[t] - before.get(t, 0.0), 3) for t in after if after[t] - before.get(t, 0.0) >= 0.01}
out = {"requests": reqs, "errors": errs, "wall_s": round(end - start, 2), "cpu_s_by_thread": spent,
       "cpu_ms_per_request_by_thread": {k: round(v * 1000 / max(reqs, 1), 3) for k, v in spent.items()},
       "cpu_ms_per_request_total": round(sum(spent.values()) * 1000 / max(reqs, 1), 3)}
json.dump(out, open(f"{d}/cpu.json", "w"), indent=1)
print(json.dumps(out, indent=1))
PY
kill -INT $pid; wait $pid
echo "done $label"
