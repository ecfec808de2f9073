#!/usr/bin/env bash
# Create a kind cluster, build and load the images, install the chart and the CPU sample.
# Needs: docker (with a running engine), kind, kubectl, helm.
#   e2e/kind/up.sh          create everything
#   e2e/kind/up.sh down     delete the cluster
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-transcription}
TAG=${IMAGE_TAG:-dev}
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed on PATH" >&2; exit 1; }
done
if [ "${1:-}" = down ]; then kind delete cluster --name "$CLUSTER"; exit 0; fi
docker info >/dev/null 2>&1 || { echo "error: no Docker engine is running" >&2; exit 1; }

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml --wait 120s

echo "==> building images (tag $TAG)"
docker build -t transcription/operator:"$TAG" -f operator/Dockerfile .
docker build -t transcription/frontend:"$TAG" -f frontend_image/Dockerfile .
docker build -t transcription/worker-cpu:"$TAG" --build-arg BAKE_MODEL=1 -f worker_image/Dockerfile.cpu .
for image in operator frontend worker-cpu; do
  kind load docker-image --name "$CLUSTER" transcription/"$image":"$TAG"
done

echo "==> installing the chart"
helm upgrade --install transcription-operator charts/transcription-operator \
  --namespace transcription-system --create-namespace --wait \
  --set image.repository=transcription/operator --set image.tag="$TAG" --set image.pullPolicy=Never \
  --set defaultImages.frontend=transcription/frontend:"$TAG" \
  --set defaultImages.fasterWhisper=transcription/worker-cpu:"$TAG" \
  --set defaultImages.pullPolicy=Never

echo "==> applying the CPU sample"
kubectl create namespace speech --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -n speech -f samples/cpu-faster-whisper.yaml
kubectl wait -n speech --for=condition=Ready tdeploy/whisper-cpu --timeout=600s
kubectl get tdeploy -n speech
echo "try: kubectl -n speech port-forward svc/whisper-cpu 8080:80, then"
echo "     curl localhost:8080/v1/audio/transcriptions -F model=whisper-1 -F file=@speech.wav"
