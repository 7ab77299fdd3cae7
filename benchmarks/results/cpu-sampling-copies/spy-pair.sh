#!/bin/bash
# generic and kani_submit once more each, under py-spy (--gil, 500 Hz): the share of the API server's event-loop
# samples spent in copy.deepcopy.
here=$(dirname "$(readlink -f "$0")")
for run in "generic-5 KANI_GENERIC_SUBMIT=1" "submit-6 KANI_GENERIC_SUBMIT=0"; do
  read -r label env <<< "$run"
  WAVES=${WAVES:-8} bash "$here/../cpu-intake-profile/run.sh" "$label" "$env"
done
