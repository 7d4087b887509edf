#!/usr/bin/env bash
# Starts (or resumes) pretraining: the same command on every worker of the slice, detached from
# the ssh session, logging to ~/bertjax-logs/RUN_NAME.log on each worker (launch/tail_logs.sh).
#
#   TPU_NAME=bert-pod ZONE=us-central2-b WORKDIR=gs://BUCKET/bert_large \
#     DATA='gs://BUCKET/tfrecords/train-*' EVAL_DATA='gs://BUCKET/tfrecords/eval-*' \
#     CONFIG=configs/large.py bash launch/run_pretraining.sh [--config.train.num_steps=...]
#
# Arguments are config overrides passed on to bertjax.main. Each worker runs
#   ~/bertjax-venv/bin/python -m bertjax.main --config=CONFIG --workdir=WORKDIR <data flags> ARGS
# in ~/bertjax; on a TPU VM bertjax.main calls jax.distributed.initialize() itself (the slice's
# hosts come from the TPU metadata).
# Rerunning after a preemption or a stop resumes from WORKDIR's latest checkpoint. To stop (a
# checkpoint is saved on SIGTERM): gcloud compute tpus tpu-vm ssh TPU_NAME --zone=ZONE
#   --worker=all --command='kill $(cat ~/bertjax-logs/bertjax.pid)'
#
# Required: TPU_NAME, ZONE, WORKDIR (gs://: checkpoints and TensorBoard, shared by all workers,
# kept after the TPU is deleted) and the data, on GCS, one of:
#   DATA        pre-masked TFRecords (comma-separated paths or globs) -> --config.data.source=
#               tfrecord --config.data.input_files=DATA; optional EVAL_DATA likewise
#               (--config.data.eval_input_files); without EVAL_DATA no evaluation runs
#               (--config.train.eval_every=0). Make them with the original BERT's flags:
#                 python -m bertjax.create_pretraining_data --input_file='corpus/*.txt' \
#                   --output_file=gs://BUCKET/tfrecords/train.tfrecord --num_output_shards=256 \
#                   --vocab_file=vocab.txt --do_lower_case --max_seq_length=128 \
#                   --max_predictions_per_seq=20 --dupe_factor=10
#               The config's data.max_seq_length, max_predictions_per_seq and vocab_file must
#               match (override them, e.g. --config.data.vocab_file=vocab.txt, a path in the repo).
#   TFDS_NAME and TFDS_DATA_DIR   a prepared TFDS dataset, e.g. TFDS_NAME=wikipedia/20230601.en
#               TFDS_DATA_DIR=gs://BUCKET/tfds (build it once with
#               `tfds build wikipedia/20230601.en --data_dir=gs://BUCKET/tfds`; nothing is
#               downloaded at training time) -> --config.data.source=tfds --config.data.tfds_name
#               --config.data.tfds_data_dir; optional TFDS_EVAL_SPLIT (without it no evaluation).
# Optional:
#   CONFIG          default configs/large.py (a path in the repository)
#   RUN_NAME        names the log (default: WORKDIR's last path component)
#   COMPILE_CHECK=1 first run `python -m bertjax.compile --config=CONFIG --topology=ACCELERATOR
#                   ARGS` here and start nothing if the config does not fit; needs ACCELERATOR
#                   (e.g. v4-32) and PYTHON (default python3) with bertjax installed
#   PROJECT, DRY_RUN=1 (print the commands instead of running them)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
handle_help "$@"

require TPU_NAME "the TPU VM name, as given to create_tpu_vm.sh"
require ZONE "the TPU zone, e.g. us-central2-b"
require WORKDIR "gs://BUCKET/DIR for checkpoints and TensorBoard"
[[ "$WORKDIR" =~ ^gs://[^/]+ ]] \
  || die "WORKDIR=$WORKDIR is not a gs:// path (every worker writes there, and it outlives the TPU)"
CONFIG="${CONFIG:-configs/large.py}"
RUN_NAME="${RUN_NAME:-$(basename "$WORKDIR")}"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "RUN_NAME=$RUN_NAME: use letters, digits, '.', '_', '-'"

# require_gcs VAR: every comma-separated entry of $VAR is a gs:// path.
require_gcs() {
  local path paths
  IFS=, read -ra paths <<<"${!1}"
  for path in "${paths[@]}"; do
    [[ "$path" =~ ^gs://[^/]+ ]] || die "$1 has '$path', not a gs:// path (the workers read it)"
  done
}

data_flags=()
if [[ -n "${DATA:-}" && -n "${TFDS_NAME:-}" ]]; then
  die "set DATA (TFRecords) or TFDS_NAME (a TFDS dataset), not both"
elif [[ -n "${DATA:-}" ]]; then
  require_gcs DATA
  data_flags=(--config.data.source=tfrecord --config.data.input_files="$DATA")
  if [[ -n "${EVAL_DATA:-}" ]]; then
    require_gcs EVAL_DATA
    data_flags+=(--config.data.eval_input_files="$EVAL_DATA")
  else
    data_flags+=(--config.train.eval_every=0)
  fi
elif [[ -n "${TFDS_NAME:-}" ]]; then
  require TFDS_DATA_DIR "gs://BUCKET/tfds, the data_dir TFDS_NAME was built into"
  require_gcs TFDS_DATA_DIR
  data_flags=(--config.data.source=tfds --config.data.tfds_name="$TFDS_NAME"
    --config.data.tfds_data_dir="$TFDS_DATA_DIR")
  if [[ -n "${TFDS_EVAL_SPLIT:-}" ]]; then
    data_flags+=(--config.data.tfds_eval_split="$TFDS_EVAL_SPLIT")
  else
    data_flags+=(--config.train.eval_every=0)
  fi
else
  die "set DATA (TFRecords on GCS, e.g. gs://BUCKET/tfrecords/train-*) or TFDS_NAME and TFDS_DATA_DIR (see --help)"
fi

if [[ "${COMPILE_CHECK:-0}" == 1 ]]; then
  require ACCELERATOR "the slice's accelerator type for COMPILE_CHECK=1, e.g. v4-32"
  (cd "$LAUNCH_DIR/.." && run "${PYTHON:-python3}" -m bertjax.compile --config="$CONFIG" \
    --topology="$ACCELERATOR" "$@") \
    || die "compile check failed: $CONFIG does not fit $ACCELERATOR (the line above says why); nothing was started"
fi

train_args=(-m bertjax.main --config="$CONFIG" --workdir="$WORKDIR" "${data_flags[@]}" "$@")
# The venv path stays unquoted so that the worker expands $HOME; every argument is quoted.
train_command="$REMOTE_VENV/bin/python $(shell_quote "${train_args[@]}")"
log="$REMOTE_LOGS/$RUN_NAME.log"
pid_file="$REMOTE_LOGS/bertjax.pid"
# One line (DRY_RUN prints one line per command). setsid + nohup + all three streams redirected:
# the process leaves the ssh session's process group and holds none of its file descriptors.
remote="set -eu; if [ ! -x $REMOTE_VENV/bin/python ]; then"
remote+=" echo \"\$(hostname): no ~/bertjax-venv: run launch/setup_tpu_vm.sh first\" >&2; exit 1; fi"
remote+="; mkdir -p $REMOTE_LOGS; cd $REMOTE_SRC"
remote+="; if [ -f $pid_file ] && kill -0 \$(cat $pid_file) 2>/dev/null; then"
remote+=" echo \"\$(hostname): bertjax.main is already running (pid \$(cat $pid_file))\" >&2; exit 1; fi"
remote+="; PYTHONUNBUFFERED=1 setsid nohup $train_command > $log 2>&1 < /dev/null & echo \$! > $pid_file"
remote+="; ln -sfn $RUN_NAME.log $REMOTE_LOGS/latest.log"
remote+="; echo \"\$(hostname): started bertjax.main (pid \$(cat $pid_file)), log $log\""
gcloud_zone compute tpus tpu-vm ssh "$TPU_NAME" --worker=all --command="$remote"
