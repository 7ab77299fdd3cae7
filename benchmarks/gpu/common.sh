# Sourced by the benchmarks/gpu/call*.sh scripts on the offline GPU machine (the stack unpacked in /tmp/site by
# ../shared/device/stage.sh). Results collect in $R and travel back as one tarball per call under $OUT.
set -u
export PYTHONPATH=$PWD:/tmp/kani-dist:/tmp/site
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_LOGGING_COLOR=0
R=/tmp/kani-results
CK=/tmp/ck
mkdir -p "$R" "$CK"

# The repo is on PYTHONPATH but not installed: give it a dist-info so vLLM finds its plugin entry points
# (models, pipelines, adapter) in every process it starts.
python3 - <<'PY'
import pathlib, tomllib
meta = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
d = pathlib.Path("/tmp/kani-dist") / f"vllm_omni_kani-{meta['version']}.dist-info"
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-omni-kani\nVersion: {meta['version']}\n")
eps = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
       for group, entries in meta.get("entry-points", {}).items()]
(d / "entry_points.txt").write_text("\n".join(eps))
PY

# step NAME TIMEOUT_S CMD...: run CMD in its own session with a hard time limit, log to $R/NAME.log, and kill
# whatever it leaves behind (servers, engine cores) so the next step finds the GPU free.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  setsid "$@" > "$R/$name.log" 2>&1 &
  local pid=$!
  ( sleep "$limit"; kill -9 -- -"$pid" 2>/dev/null ) &
  local killer=$!
  wait "$pid"; local rc=$?
  kill "$killer" 2>/dev/null; wait "$killer" 2>/dev/null
  kill -9 -- -"$pid" 2>/dev/null
  echo "[$name] rc=$rc in $((SECONDS - start)) s"
  grep -E "^(c=|warm-up|e2e|batch|wrote|captured|naive request 7|\{'variant')|Error|error:" "$R/$name.log" | tail -n 12
}

# pack TAG: everything gathered so far, one file back (the tool returns at most 8 files per call).
pack() {
  python3 -m vllm_omni_kani.cli bench --report-only --out "$R" > /dev/null 2>&1 || true
  tar -C /tmp -czf "$OUT/results-$1.tgz" kani-results
  cp "$R/report.md" "$OUT/report-$1.md" 2>/dev/null || true
}

bench() { python3 -m vllm_omni_kani.cli bench "$@"; }
