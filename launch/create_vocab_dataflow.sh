#!/usr/bin/env bash
# Builds a WordPiece vocab (or a SentencePiece model) from raw text on GCS with Google Cloud
# Dataflow: the command is vocab --runner=DataflowRunner (bertjax/data/vocab_beam.py). Dataflow's
# workers read the corpus, count its words and keep only what the WordPiece learner uses (at most
# its 5,000,000 most frequent words, whatever the corpus), or draw the SentencePiece sample; the
# learner then runs on this machine, which needs memory for those (docs/benchmarks.md, "Offline
# TFRecords"). The vocab is the one a local run of the same flags builds, byte for byte.
#
#   PROJECT=my-project REGION=us-central1 INPUT='gs://BUCKET/corpus/*.txt.gz' \
#     OUTPUT=gs://BUCKET/vocab.txt bash launch/create_vocab_dataflow.sh --vocab_size=30522 \
#       --do_lower_case --num_unused=994
#
# Arguments are vocab flags (--vocab_size, --do_lower_case, --type, --num_unused); --input_file,
# --output_file, --runner and --beam_pipeline_options come from the variables below. It runs
# here, with PYTHON, in two steps:
#   1. python -m build --sdist: this checkout as a source package, in a fresh directory;
#   2. python -m bertjax.vocab --runner=DataflowRunner ..., with Beam's options
#      --project --region --temp_location --job_name and --extra_package=<the sdist>.
# Staging: an sdist of this checkout through --extra_package (launch/dataflow.sh says why).
# Then build TFRecords with it: launch/create_data_dataflow.sh with VOCAB=<OUTPUT>.
# Required:
#   PROJECT, REGION   the Google Cloud project and the Dataflow region, e.g. us-central1
#   INPUT             text on GCS: gs:// paths or globs, comma-separated (.gz is read as gzip)
#   OUTPUT            gs://BUCKET/DIR/vocab.txt (or NAME.model with --type=sentencepiece)
# Optional:
#   TEMP_LOCATION     Dataflow's staging and temp files (default gs://<OUTPUT's bucket>/dataflow)
#   JOB_NAME          default bertjax-vocab-<UTC time>
#   MAX_WORKERS       --max_num_workers (Dataflow's autoscaling ceiling)
#   MACHINE_TYPE      --worker_machine_type, e.g. n2-standard-8
#   DISK_GB           --disk_size_gb, a worker's disk, default 250 (below)
#   PYTHON            default python3, with bertjax[beam] installed (pip install -e '.[beam]')
#   DRY_RUN=1         print the commands instead of running them
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=dataflow.sh
source "$(dirname "$0")/dataflow.sh"
handle_help "$@"

require INPUT "text on GCS, e.g. 'gs://BUCKET/corpus/*.txt.gz'"
require OUTPUT "gs://BUCKET/DIR/vocab.txt"
require_gcs INPUT
require_gcs OUTPUT
refuse_flags input_file output_file runner beam_pipeline_options -- "$@"
dataflow_run vocab --input_file="$INPUT" --output_file="$OUTPUT" "$@"
