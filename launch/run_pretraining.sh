#!/usr/bin/env bash
# Starts (or resumes) pretraining on every worker of a TPU VM slice, in the background.
#
#   TPU_NAME=bert-pod ZONE=us-central2-b WORKDIR=gs://BUCKET/bert_large \
#     CONFIG=configs/large.py bash launch/run_pretraining.sh --config.model.dtype=bfloat16
#
# Extra arguments are passed to bertjax.main (config overrides). Every worker runs the same
# command; on a multi-host slice bertjax.main calls jax.distributed.initialize() itself. The
# command is idempotent: re-running it after a preemption resumes from WORKDIR's checkpoint.
# Logs: ~/bertjax/train.log on each worker (see launch/tail_logs.sh).
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR (gs://...)}"
CONFIG="${CONFIG:-configs/large.py}"
PROJECT_FLAG=()
[[ -n "${PROJECT:-}" ]] && PROJECT_FLAG=(--project="$PROJECT")
ARGS="$(printf ' %q' "$@")"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all "${PROJECT_FLAG[@]}" \
  --command="cd ~/bertjax && nohup python3 -m bertjax.main --config=$CONFIG \
    --workdir=$WORKDIR $ARGS > train.log 2>&1 &"
