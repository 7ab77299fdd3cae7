# Sourced by the benchmarks/gpu/call*.sh scripts on the offline GPU machine (the stack unpacked in /tmp/site by
# ../shared/device/stage.sh). Results collect in $R and travel back as one tarball per call under $OUT.
set -u
# Run the package as committed: the transferred working tree can hold unfinished edits of other work. A call that
# carries .devsrc/src.tar (made here by `git archive HEAD vllm_omni_kani -o .devsrc/src.tar`) replaces the package.
if [ -f .devsrc/src.tar ]; then rm -rf vllm_omni_kani && tar -xf .devsrc/src.tar && echo "package: $(cat .devsrc/commit)"; fi
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

# kids PID: the process ids whose parent is PID.
kids() { awk -v p="$1" '/^PPid:/ && $2 == p { split(FILENAME, a, "/"); print a[3] }' /proc/[0-9]*/status 2>/dev/null; }

# step NAME TIMEOUT_S CMD...: run CMD in its own session with a hard time limit, log to $R/NAME.log, and kill
# whatever it leaves behind (servers, engine cores) so the next step finds the GPU free. A server that
# `bench --serve` started runs in a process group of its own: at the time limit the groups of CMD's children go too.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  setsid "$@" > "$R/$name.log" 2>&1 &
  local pid=$!
  ( sleep "$limit"; for c in $(kids "$pid"); do kill -9 -- -"$c" 2>/dev/null; done; kill -9 -- -"$pid" 2>/dev/null ) &
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
