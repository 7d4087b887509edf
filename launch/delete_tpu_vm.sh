#!/usr/bin/env bash
# Deletes the TPU VM (checkpoints in the gs:// workdir are kept).
#
#   TPU_NAME=bert-pod ZONE=us-central2-b bash launch/delete_tpu_vm.sh
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --quiet
