#!/usr/bin/env bash
# Requests a Cloud TPU slice (single host or pod slice) as a queued resource, waits until it is
# ACTIVE, then installs Python >= 3.11 and bertjax on every worker (launch/setup_tpu_vm.sh).
#
#   TPU_NAME=bert-pod ZONE=us-central2-b ACCELERATOR=v4-32 CAPACITY=spot \
#     bash launch/create_tpu_vm.sh
#
# Required: TPU_NAME (names both the queued resource and its TPU VM node), ZONE, ACCELERATOR
# (e.g. v4-8, v4-32, v5litepod-8, v5litepod-16, v5p-8, v6e-8).
# Optional:
#   CAPACITY         on-demand (default) | spot (preemptible, no time limit; `--spot`) |
#                    best-effort (the older preemptible tier; `--best-effort` exists only in
#                    `gcloud alpha`, so that request goes through the alpha track) |
#                    reserved (your reservation; `--reserved`)
#   RUNTIME          TPU software version; default by generation: v6e v2-alpha-tpuv6e,
#                    v5p v2-alpha-tpuv5, v5litepod v2-alpha-tpuv5-lite, v2/v3/v4
#                    tpu-ubuntu2204-base (all Ubuntu 22.04 with python3.10: see setup_tpu_vm.sh)
#   POLL_SECONDS     between state checks (default 30)
#   TIMEOUT_SECONDS  give up waiting for ACTIVE after this long (default 7200; 0 = never); the
#                    request stays queued: run setup_tpu_vm.sh once it is ACTIVE
#   REPO, REF, PYTHON_VERSION   passed to setup_tpu_vm.sh
#   PROJECT          gcloud project (default: gcloud's configured one)
#   DRY_RUN=1        print the commands instead of running them (assumes ACTIVE at once)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
handle_help "$@"
no_arguments "$@"

require TPU_NAME "a name for the queued resource and its TPU VM, e.g. bert-pod"
require ZONE "the TPU zone, e.g. us-central2-b"
require ACCELERATOR "the accelerator type, e.g. v4-8, v4-32, v5litepod-16, v6e-8"
RUNTIME="${RUNTIME:-$(runtime_for_accelerator "$ACCELERATOR")}" \
  || die "no default runtime for ACCELERATOR=$ACCELERATOR; set RUNTIME (a TPU software version)"
POLL_SECONDS="${POLL_SECONDS:-30}"
TIMEOUT_SECONDS="${TIMEOUT_SECONDS:-7200}"
[[ "$POLL_SECONDS" =~ ^[0-9]+$ ]] || die "POLL_SECONDS=$POLL_SECONDS is not a number of seconds"
[[ "$TIMEOUT_SECONDS" =~ ^[0-9]+$ ]] || die "TIMEOUT_SECONDS=$TIMEOUT_SECONDS is not a number of seconds"

track=()  # the GA gcloud track, except for best-effort
capacity_flag=()
case "${CAPACITY:-on-demand}" in
  on-demand) ;;
  spot) capacity_flag=(--spot) ;;
  reserved) capacity_flag=(--reserved) ;;
  best-effort) track=(alpha); capacity_flag=(--best-effort) ;;
  *) die "CAPACITY=$CAPACITY: use on-demand, spot, best-effort or reserved" ;;
esac

queued_resources=("${track[@]}" compute tpus queued-resources)
gcloud_zone "${queued_resources[@]}" create "$TPU_NAME" --node-id="$TPU_NAME" \
  --accelerator-type="$ACCELERATOR" --runtime-version="$RUNTIME" "${capacity_flag[@]}"

# States: cloud.google.com/tpu/docs/queued-resources. FAILED and SUSPENDED never become ACTIVE.
describe=("${queued_resources[@]}" describe "$TPU_NAME" --format='value(state.state)')
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  gcloud_zone "${describe[@]}"
else
  state=""
  start=$SECONDS
  while :; do
    state="$(gcloud_zone "${describe[@]}")" \
      || die "could not read the state of queued resource $TPU_NAME (gcloud said why above)"
    case "$state" in
      ACTIVE) break ;;
      FAILED | SUSPENDED | SUSPENDING)
        die "queued resource $TPU_NAME is $state; see \`gcloud compute tpus queued-resources describe $TPU_NAME --zone=$ZONE\`, then delete_tpu_vm.sh" ;;
    esac
    if ((TIMEOUT_SECONDS > 0 && SECONDS - start >= TIMEOUT_SECONDS)); then
      die "queued resource $TPU_NAME still ${state:-without a state} after ${TIMEOUT_SECONDS}s; it stays queued: run setup_tpu_vm.sh once it is ACTIVE, or delete_tpu_vm.sh"
    fi
    echo "$SCRIPT_NAME: $TPU_NAME is ${state:-without a state}; next check in ${POLL_SECONDS}s" >&2
    sleep "$POLL_SECONDS"
  done
  echo "$SCRIPT_NAME: $TPU_NAME is ACTIVE; setting up every worker" >&2
fi

TPU_NAME="$TPU_NAME" ZONE="$ZONE" bash "$LAUNCH_DIR/setup_tpu_vm.sh"
