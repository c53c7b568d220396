#!/usr/bin/env bash
# Create a local kind cluster with two islands of fake JAX CPU devices, build the image, load it,
# install the chart with values-kind.yaml, run the demo program and print its status.
#
#   scripts/kind-up.sh            # or: make kind-up
#   scripts/kind-down.sh          # deletes the cluster
#
# Environment: CLUSTER (kind cluster name, default pathways), IMAGE (default
# ghcr.io/pathways-k8s/pathways:dev; with a tag), NAMESPACE (of the release, default
# pathways-system), TIMEOUT (seconds, for each wait, default 300), SKIP_BUILD=1 (reuse an
# image already built). Running it again rebuilds, rolls the pods onto the new image and runs
# the demo afresh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${CLUSTER:-pathways}"
IMAGE="${IMAGE:-ghcr.io/pathways-k8s/pathways:dev}"
NAMESPACE="${NAMESPACE:-pathways-system}"
TIMEOUT="${TIMEOUT:-300}"
TIMEOUT="${TIMEOUT%s}"  # 300s as well as 300
CONTEXT="kind-${CLUSTER}"
# helm and kubectl from scripts/fetch_tools.py, when installed, else from PATH.
export PATH="${ROOT}/.tools/bin:${PATH}"

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'kind-up: %s\n' "$*" >&2; exit 1; }

# On any failure, what a user looks at next, then how to start over.
diagnose() {
  printf '\nkind-up: failed at line %s; the cluster as it is:\n' "$1" >&2
  kubectl --context "$CONTEXT" get pods -A -o wide >&2 || true
  kubectl --context "$CONTEXT" get islands -o wide >&2 || true
  kubectl --context "$CONTEXT" -n "$NAMESPACE" logs deploy/pathways-operator --tail 30 >&2 || true
  printf '\nkind-up: fix the cause and run it again, or start over: scripts/kind-down.sh\n' >&2
}

[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "TIMEOUT must be a number of seconds, not '${TIMEOUT}'"
[[ "${IMAGE##*/}" == *:* ]] || die "IMAGE must carry a tag (repository:tag), not '${IMAGE}'"

for tool in docker kind kubectl helm; do
  command -v "$tool" > /dev/null || die "$tool is not installed (helm and kubectl: make tools)"
done
docker info > /dev/null 2>&1 || die "docker is installed but its daemon does not answer"

if kind get clusters 2> /dev/null | grep -x "$CLUSTER" > /dev/null; then
  say "kind cluster ${CLUSTER} exists"
  kind export kubeconfig --name "$CLUSTER"  # its context, in case it was removed
else
  say "creating kind cluster ${CLUSTER}"
  kind create cluster --name "$CLUSTER" --config "${ROOT}/kind-config.yaml" --wait "${TIMEOUT}s"
fi
trap 'diagnose $LINENO' ERR

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  say "building ${IMAGE} (JAX for CPU)"
  docker build --build-arg JAX_VARIANT=cpu -t "$IMAGE" "$ROOT"
fi
# A tag of the image's content: a rebuilt image gets a new one, so the pods roll onto it
# (the same tag loaded again changed nothing in the running pods).
ID="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
REPOSITORY="${IMAGE%:*}"
TAG="${IMAGE##*:}-${ID#sha256:}"
TAG="${TAG:0:40}"
docker tag "$IMAGE" "${REPOSITORY}:${TAG}"
say "loading ${REPOSITORY}:${TAG} into the cluster's nodes"
kind load docker-image "${REPOSITORY}:${TAG}" --name "$CLUSTER"

say "applying the CRDs (helm never upgrades those of crds/)"
kubectl --context "$CONTEXT" apply --server-side -f "${ROOT}/charts/pathways/crds/"

say "installing the chart (values-kind.yaml)"
helm upgrade --install pathways "${ROOT}/charts/pathways" \
  --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
  --values "${ROOT}/charts/pathways/values-kind.yaml" \
  --set "image.repository=${REPOSITORY}" --set "image.tag=${TAG}" \
  --wait --timeout "${TIMEOUT}s"

say "waiting for the islands"
kubectl --context "$CONTEXT" wait island --all \
  --for=jsonpath='{.status.phase}'=Ready --timeout "${TIMEOUT}s"
kubectl --context "$CONTEXT" get islands

say "running the demo program"
# A demo of an earlier run goes first: its phase would be read as this run's.
kubectl --context "$CONTEXT" -n pathways-demo delete pathwaysprogram demo \
  --ignore-not-found --wait --timeout "${TIMEOUT}s"
kubectl --context "$CONTEXT" apply -f "${ROOT}/scripts/kind/demo-program.yaml"
phase="" said=""
deadline=$((SECONDS + 2 * TIMEOUT))
while ((SECONDS < deadline)); do
  phase="$(kubectl --context "$CONTEXT" -n pathways-demo get pathwaysprogram demo \
    -o jsonpath='{.status.phase}' 2> /dev/null || true)"
  if [[ "$phase" != "$said" ]]; then
    printf '  demo: %s\n' "${phase:-(no status yet)}"
    said="$phase"
  fi
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
