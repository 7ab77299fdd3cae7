#!/bin/bash
# generic (KANI_GENERIC_SUBMIT=1: vLLM-Omni's generic path) and kani_submit (the default), alternating; no py-spy.
here=$(dirname "$(readlink -f "$0")")
rm -rf /tmp/cip/generic-[1-4] /tmp/cip/submit-[1-4]
for run in "generic-1 KANI_GENERIC_SUBMIT=1" "submit-2 KANI_GENERIC_SUBMIT=0" "generic-3 KANI_GENERIC_SUBMIT=1" \
  "submit-4 KANI_GENERIC_SUBMIT=0"; do
  read -r label env <<< "$run"
  NO_SPY=1 WAVES=${WAVES:-12} bash "$here/../cpu-intake-profile/run.sh" "$label" "$env"
done
