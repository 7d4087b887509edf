#!/usr/bin/env bash
# Builds pretraining TFRecords from raw text on GCS with Google Cloud Dataflow: the command is
# create_pretraining_data --runner=DataflowRunner (bertjax/data/offline_beam.py), whose output is
# byte-identical to a local run of the same flags.
#
#   PROJECT=my-project REGION=us-central1 INPUT='gs://BUCKET/corpus/*.txt.gz' \
#     OUTPUT=gs://BUCKET/tfrecords/train.tfrecord VOCAB=gs://BUCKET/vocab.txt \
#     bash launch/create_data_dataflow.sh --num_output_shards=256 --do_lower_case \
#       --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10
#
# Arguments are create_pretraining_data flags (the original script's, and --pack_sequences,
# --work_unit_bytes, ...); --input_file, --output_file, --vocab_file, --runner and
# --beam_pipeline_options come from the variables below. It runs here, with PYTHON, in two steps:
#   1. python -m build --sdist: this checkout as a source package, in a fresh directory;
#   2. python -m bertjax.create_pretraining_data --runner=DataflowRunner ..., with Beam's options
#      --project --region --temp_location --job_name and --extra_package=<the sdist>.
# Staging: an sdist of this checkout through --extra_package (launch/dataflow.sh says why).
# This machine only lists the input files' sizes and waits for the job; the workers cut the corpus
# into work units, tokenize, mask and write. Then train with launch/run_pretraining.sh and
# DATA='gs://BUCKET/tfrecords/train.tfrecord-*'.
# Required:
#   PROJECT, REGION   the Google Cloud project and the Dataflow region, e.g. us-central1
#   INPUT             text on GCS: gs:// paths or globs, comma-separated (.gz is read as gzip)
#   OUTPUT            gs://BUCKET/DIR/NAME.tfrecord (with --num_output_shards=N: NAME.tfrecord-
#                     00000-of-0000N, ...)
#   VOCAB             the vocab on GCS (vocab.txt, or a SentencePiece .model), read by workers
# Optional:
#   TEMP_LOCATION     Dataflow's staging and temp files (default gs://<OUTPUT's bucket>/dataflow)
#   JOB_NAME          default bertjax-create-pretraining-data-<UTC time>
#   MAX_WORKERS       --max_num_workers (Dataflow's autoscaling ceiling)
#   MACHINE_TYPE      --worker_machine_type, default n2-standard-4 (below)
#   DISK_GB           --disk_size_gb, a worker's disk, default 250 (below)
#   PYTHON            default python3, with bertjax[beam] installed (pip install -e '.[beam]')
#   DRY_RUN=1         print the commands instead of running them
# Defaults from the measured memory (docs/benchmarks.md, "Offline TFRecords": a worker process
# peaks at 1.5 GiB or less, the same with 16 MiB and 256 MiB units, at L=128 and 512, packed
# or not): --work_unit_bytes=268435456 (256 MiB: few scratch objects, no memory cost) unless the
# arguments give one, and n2-standard-4 workers (one Python SDK process per vCPU, 4 GB per vCPU:
# over twice the peak; a highcpu type's 1 GB per vCPU would not hold it). A unit's pieces are
# spooled on the worker's disk before they land (up to 26 bytes per byte of text at dupe_factor
# 10: ~7 GB per 256 MiB unit, one unit per vCPU), and so is an output shard before its upload
# (bertjax/atomic.py): DISK_GB=250 instead of the 25 GB Dataflow gives batch jobs with its
# Shuffle service.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=dataflow.sh
source "$(dirname "$0")/dataflow.sh"
handle_help "$@"

require INPUT "text on GCS, e.g. 'gs://BUCKET/corpus/*.txt.gz'"
require OUTPUT "gs://BUCKET/DIR/NAME.tfrecord"
require VOCAB "the vocab on GCS, e.g. gs://BUCKET/vocab.txt"
require_gcs INPUT
require_gcs OUTPUT
require_gcs VOCAB
refuse_flags input_file output_file vocab_file runner beam_pipeline_options -- "$@"
MACHINE_TYPE="${MACHINE_TYPE:-n2-standard-4}"
DISK_GB="${DISK_GB:-250}"
unit_bytes=(--work_unit_bytes=268435456)
for arg in "$@"; do
  [[ "$arg" != --work_unit_bytes=* && "$arg" != --work_unit_bytes ]] || unit_bytes=()
done
dataflow_run create_pretraining_data \
  --input_file="$INPUT" --output_file="$OUTPUT" --vocab_file="$VOCAB" "${unit_bytes[@]}" "$@"
