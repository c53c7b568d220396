#!/usr/bin/env bash
# Delete the kind cluster scripts/kind-up.sh created (CLUSTER, default pathways).
set -euo pipefail

CLUSTER="${CLUSTER:-pathways}"
command -v kind > /dev/null || { echo "kind-down: kind is not installed" >&2; exit 1; }
if kind get clusters 2> /dev/null | grep -x "$CLUSTER" > /dev/null; then
  kind delete cluster --name "$CLUSTER"
else
  echo "kind-down: no kind cluster named ${CLUSTER}"
fi
