#!/usr/bin/env bash
# Shows the log of the latest run (or of RUN_NAME) on worker 0, which prints the step lines, or
# on every worker (each line prefixed with the worker's hostname).
#
#   TPU_NAME=bert-pod ZONE=us-central2-b FOLLOW=1 bash launch/tail_logs.sh
#
# Required: TPU_NAME, ZONE.
# Optional:
#   WORKER    0 (default), another worker index, or all
#   FOLLOW=1  keep following the log (Ctrl-C to stop; the run goes on)
#   LINES     how many last lines to show first (default 50)
#   RUN_NAME  the run whose log to show (default: the latest one started by run_pretraining.sh)
#   PROJECT, DRY_RUN=1 (print the command instead of running it)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
handle_help "$@"
no_arguments "$@"

require TPU_NAME "the TPU VM name, as given to create_tpu_vm.sh"
require ZONE "the TPU zone, e.g. us-central2-b"
WORKER="${WORKER:-0}"
LINES="${LINES:-50}"
RUN_NAME="${RUN_NAME:-latest}"
[[ "$WORKER" =~ ^([0-9]+|all)$ ]] || die "WORKER=$WORKER: use a worker index (0, 1, ...) or all"
[[ "$LINES" =~ ^[0-9]+$ ]] || die "LINES=$LINES is not a number"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "RUN_NAME=$RUN_NAME: use letters, digits, '.', '_', '-'"

follow=""
[[ "${FOLLOW:-0}" != 1 ]] || follow=" -F"
remote="tail -n $LINES$follow $REMOTE_LOGS/$RUN_NAME.log"
if [[ "$WORKER" == all ]]; then
  remote+=" | sed -u \"s/^/\$(hostname): /\""
fi
gcloud_zone compute tpus tpu-vm ssh "$TPU_NAME" --worker="$WORKER" --command="$remote"
