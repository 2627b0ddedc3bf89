#!/usr/bin/env bash
# End to end on a machine with Docker, kind, kubectl and helm: a kind cluster of simulated GPU
# nodes -> the NVIDIA device plugin -> nvidia.com/gpu allocatable -> a pod running nvidia-smi ->
# a fault injected through a Node annotation -> the MokkaGPUHealthy condition turns False.
#   deploy/kind/e2e.sh            # KEEP=1 keeps the cluster afterwards
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${CLUSTER:-mokkafs}
node_image=${NODE_IMAGE:-mokkafs/kind-node:v1.32.2}
agent_image=${AGENT_IMAGE:-mokkafs/agent:dev}
plugin_chart_version=${PLUGIN_CHART_VERSION:-0.17.1}

log() { printf '\n== %s\n' "$*"; }

cleanup() {
    if [[ "${KEEP:-0}" != 1 ]]; then
        kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
    fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "timed out waiting for: $what" >&2
            return 1
        fi
        sleep 2
    done
}

for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || { echo "e2e.sh needs $tool on PATH" >&2; exit 2; }
done

log "images"
docker build -f "$here/Dockerfile" -t "$node_image" "$repo"
docker build -f "$repo/deploy/Dockerfile" -t "$agent_image" "$repo"

log "cluster"
trap cleanup EXIT
kind create cluster --name "$cluster" --config "$here/kind-config.yaml" --wait 120s
kind load docker-image --name "$cluster" "$agent_image"
worker=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{.items[0].metadata.name}')
docker exec "$cluster-control-plane" systemctl is-active mokkafs.service
docker exec "$worker" cat /var/lib/mokkafs/root/node/gpu_count

log "agent DaemonSet"
kubectl apply -k "$here"
kubectl -n mokkafs rollout status daemonset/mokkafs-agent --timeout=120s
docker exec "$worker" test -s /var/run/cdi/nvidia.yaml
docker exec "$worker" cat /etc/kubernetes/node-feature-discovery/features.d/mokkafs

log "NVIDIA device plugin (driverRoot = the simulated node's driver/)"
helm repo add nvdp https://nvidia.github.io/k8s-device-plugin >/dev/null
helm repo update nvdp >/dev/null
helm upgrade -i nvdp nvdp/nvidia-device-plugin --version "$plugin_chart_version" \
    -n nvidia-device-plugin --create-namespace -f "$here/device-plugin-values.yaml" --wait --timeout 180s
gpus_allocatable() {
    [[ "$(kubectl get node "$worker" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == 8 ]]
}
wait_for 120 "nvidia.com/gpu: 8 allocatable on $worker" gpus_allocatable

log "a pod running nvidia-smi"
kubectl apply -f "$here/nvidia-smi-pod.yaml"
pod_done() {
    [[ "$(kubectl get pod nvidia-smi -o jsonpath='{.status.phase}')" == Succeeded ]]
}
wait_for 180 "pod nvidia-smi to succeed" pod_done
# One GPU given, one listed: the allocation, not the whole node.
[[ "$(kubectl logs nvidia-smi | tee /dev/stderr | grep -c '^GPU [0-9]*: NVIDIA H100')" == 1 ]]
kubectl logs nvidia-smi | grep -q '^GPU 0: '

log "fault injection through a Node annotation"
kubectl annotate node "$worker" --overwrite 'mokkafs.io/inject=gpu=3 xid=79'
condition_false() {
    [[ "$(kubectl get node "$worker" -o jsonpath='{.status.conditions[?(@.type=="MokkaGPUHealthy")].status}')" == False ]]
}
wait_for 60 "MokkaGPUHealthy=False on $worker" condition_false
docker exec "$worker" cat /var/lib/mokkafs/root/gpu3/lost | grep -qx 1
kubectl get events --field-selector "involvedObject.name=$worker,reason=InjectionApplied" -o name | grep -q .
kubectl annotate node "$worker" --overwrite 'mokkafs.io/inject=node reset=1'
condition_true() {
    [[ "$(kubectl get node "$worker" -o jsonpath='{.status.conditions[?(@.type=="MokkaGPUHealthy")].status}')" == True ]]
}
wait_for 60 "MokkaGPUHealthy=True again" condition_true

log "passed"
