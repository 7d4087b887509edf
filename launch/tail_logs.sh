#!/usr/bin/env bash
# Shows the training log of worker 0 (the one that prints step lines and writes TensorBoard).
#
#   TPU_NAME=bert-pod ZONE=us-central2-b bash launch/tail_logs.sh
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=0 \
  --command="tail -n 50 -f ~/bertjax/train.log"
