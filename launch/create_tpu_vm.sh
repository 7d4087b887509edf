#!/usr/bin/env bash
# Creates a Cloud TPU VM (single host or pod slice) and installs bertjax on every worker.
#
#   TPU_NAME=bert-pod ZONE=us-central2-b ACCELERATOR=v4-32 bash launch/create_tpu_vm.sh
#
# Optional: RUNTIME (TPU software version), SPOT=1 for a spot (preemptible) slice, REPO (git URL
# or local path copied with scp), PROJECT. Needs an authenticated gcloud.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${ACCELERATOR:?set ACCELERATOR, e.g. v4-8}"
RUNTIME="${RUNTIME:-tpu-ubuntu2204-base}"
REPO="${REPO:-$(cd "$(dirname "$0")/.." && pwd)}"
PROJECT_FLAG=()
[[ -n "${PROJECT:-}" ]] && PROJECT_FLAG=(--project="$PROJECT")
SPOT_FLAG=()
[[ "${SPOT:-0}" == "1" ]] && SPOT_FLAG=(--spot)

gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR" --version="$RUNTIME" "${PROJECT_FLAG[@]}" "${SPOT_FLAG[@]}"

if [[ -d "$REPO" ]]; then
  tar -C "$REPO" --exclude=.git -czf /tmp/bertjax_src.tgz .
  gcloud compute tpus tpu-vm scp /tmp/bertjax_src.tgz "$TPU_NAME":~/bertjax_src.tgz \
    --zone="$ZONE" --worker=all "${PROJECT_FLAG[@]}"
  FETCH="mkdir -p ~/bertjax && tar -C ~/bertjax -xzf ~/bertjax_src.tgz"
else
  FETCH="git clone $REPO ~/bertjax"
fi
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all "${PROJECT_FLAG[@]}" \
  --command="$FETCH && cd ~/bertjax && pip install -U pip && pip install 'jax[tpu]==0.10.2' -e ."
