#!/usr/bin/env bash
# Create a local kind cluster with two islands of fake JAX CPU devices, build the image, load it,
# install the chart with values-kind.yaml, run the demo program and print its status.
#
#   scripts/kind-up.sh            # or: make kind-up
#   scripts/kind-down.sh          # deletes the cluster
#
# Environment: CLUSTER (kind cluster name, default pathways), IMAGE (default
# ghcr.io/pathways-k8s/pathways:dev), NAMESPACE (of the release, default pathways-system),
# TIMEOUT (for each wait, default 300s), SKIP_BUILD=1 (reuse an image already built).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${CLUSTER:-pathways}"
IMAGE="${IMAGE:-ghcr.io/pathways-k8s/pathways:dev}"
NAMESPACE="${NAMESPACE:-pathways-system}"
TIMEOUT="${TIMEOUT:-300s}"
CONTEXT="kind-${CLUSTER}"
# helm and kubectl from scripts/fetch_tools.py, when installed, else from PATH.
export PATH="${ROOT}/.tools/bin:${PATH}"

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'kind-up: %s\n' "$*" >&2; exit 1; }

for tool in docker kind kubectl helm; do
  command -v "$tool" > /dev/null || die "$tool is not installed (helm and kubectl: make tools)"
done
docker info > /dev/null 2>&1 || die "docker is installed but its daemon does not answer"

if kind get clusters 2> /dev/null | grep -x "$CLUSTER" > /dev/null; then
  say "kind cluster ${CLUSTER} exists"
else
  say "creating kind cluster ${CLUSTER}"
  kind create cluster --name "$CLUSTER" --config "${ROOT}/kind-config.yaml" --wait "$TIMEOUT"
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  say "building ${IMAGE} (JAX for CPU)"
  docker build --build-arg JAX_VARIANT=cpu -t "$IMAGE" "$ROOT"
fi
say "loading ${IMAGE} into the cluster's nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER"

say "installing the chart (values-kind.yaml)"
helm upgrade --install pathways "${ROOT}/charts/pathways" \
  --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
  --values "${ROOT}/charts/pathways/values-kind.yaml" \
  --set "image.repository=${IMAGE%:*}" --set "image.tag=${IMAGE##*:}" \
  --wait --timeout "$TIMEOUT"

say "waiting for the islands"
kubectl --context "$CONTEXT" wait island --all \
  --for=jsonpath='{.status.phase}'=Ready --timeout "$TIMEOUT"
kubectl --context "$CONTEXT" get islands

say "running the demo program"
kubectl --context "$CONTEXT" apply -f "${ROOT}/scripts/kind/demo-program.yaml"
phase=""
for _ in $(seq 1 120); do
  phase="$(kubectl --context "$CONTEXT" -n pathways-demo get pathwaysprogram demo \
    -o jsonpath='{.status.phase}' 2> /dev/null || true)"
  [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
  sleep 5
done

say "status of the demo program"
kubectl --context "$CONTEXT" -n pathways-demo get pathwaysprograms,virtualslices,jobs,pods -o wide
kubectl --context "$CONTEXT" -n pathways-demo get pathwaysprogram demo -o jsonpath='{.status}'
echo
for job in $(kubectl --context "$CONTEXT" -n pathways-demo get jobs -o name); do
  kubectl --context "$CONTEXT" -n pathways-demo logs --tail 20 "$job" || true
done

if [[ "$phase" != Succeeded ]]; then
  die "the demo program ended in phase '${phase:-unknown}' (see the status above)"
fi
say "done: kubectl --context ${CONTEXT} get pwp -A; scripts/kind-down.sh deletes the cluster"
