#!/usr/bin/env bash
# Deletes the queued resource and its TPU VM(s). Checkpoints and TensorBoard logs in the gs://
# WORKDIR are kept; the logs in ~/bertjax-logs on the workers are not.
#
#   TPU_NAME=bert-pod ZONE=us-central2-b bash launch/delete_tpu_vm.sh
#
# Required: TPU_NAME, ZONE.
# Optional: ASYNC=1 (return without waiting for the deletion), PROJECT, DRY_RUN=1 (print the
# command instead of running it).
#
# `--force` deletes the running nodes first (without it, gcloud refuses while the queued resource
# has nodes); `--quiet` answers gcloud's confirmation prompt.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
handle_help "$@"
no_arguments "$@"

require TPU_NAME "the queued resource's name, as given to create_tpu_vm.sh"
require ZONE "the TPU zone, e.g. us-central2-b"
async=()
[[ "${ASYNC:-0}" != 1 ]] || async=(--async)
gcloud_zone compute tpus queued-resources delete "$TPU_NAME" --force --quiet "${async[@]}"
