# shellcheck shell=bash
# Shared by the Dataflow scripts (create_data_dataflow.sh, create_vocab_dataflow.sh; sourced after
# common.sh, never run): the gs:// checks, Beam's Dataflow options and the staging of bertjax.
#
# Staging is an sdist through --extra_package: each Dataflow worker pip-installs exactly this
# checkout (uncommitted changes too) with the dependencies setup.cfg states, and nothing has to
# be published or built into an image. Dataflow's default container runs the Python minor
# version that launched the job, so launch with the Python (>= 3.11) the workers should use.

# require_gcs VAR: every comma-separated entry of $VAR is a gs:// path (the workers read it).
require_gcs() {
  local path paths
  IFS=, read -ra paths <<<"${!1}"
  for path in "${paths[@]}"; do
    [[ "$path" =~ ^gs://[^/]+/. ]] || die "$1 has '$path', not a gs:// path (Dataflow's workers read it)"
  done
}

# refuse_flags NAME... -- ARGS...: a one-line error when ARGS set a flag the variables set.
refuse_flags() {
  local names=() arg name
  while [[ "$1" != -- ]]; do names+=("$1"); shift; done
  shift
  for arg in "$@"; do
    for name in "${names[@]}"; do
      [[ "$arg" != "--$name="* && "$arg" != "--$name" ]] \
        || die "--$name comes from the variables (see --help), not the arguments"
    done
  done
}

# dataflow_run MODULE ARGS...: python -m bertjax.MODULE --runner=DataflowRunner ARGS, with
# Beam's options from PROJECT, REGION, TEMP_LOCATION (default gs://<OUTPUT's bucket>/dataflow),
# JOB_NAME (default bertjax-MODULE-<UTC time>), MAX_WORKERS, MACHINE_TYPE, DISK_GB and the sdist of this
# checkout, built first with PYTHON (default python3) in a directory removed at exit.
dataflow_run() {
  local module="$1" bucket repo version sdist
  shift
  require PROJECT "the Google Cloud project"
  require REGION "the Dataflow region, e.g. us-central1"
  bucket="${OUTPUT#gs://}"
  bucket="${bucket%%/*}"
  TEMP_LOCATION="${TEMP_LOCATION:-gs://$bucket/dataflow}"
  require_gcs TEMP_LOCATION
  JOB_NAME="${JOB_NAME:-bertjax-${module//_/-}-$(date -u +%Y%m%d-%H%M%S)}"
  [[ "$JOB_NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
    || die "JOB_NAME=$JOB_NAME: Dataflow takes lower-case letters, digits and '-', starting with a letter"
  PYTHON="${PYTHON:-python3}"
  repo="$(cd "$LAUNCH_DIR/.." && pwd)"
  version="$(sed -n 's/^version *= *//p' "$repo/setup.cfg")"
  [[ -n "$version" ]] || die "$repo/setup.cfg has no version line"
  DATAFLOW_DIST="$(mktemp -d "${TMPDIR:-/tmp}/bertjax-sdist.XXXXXX")"
  trap 'rm -rf "$DATAFLOW_DIST"' EXIT
  sdist="$DATAFLOW_DIST/bertjax-$version.tar.gz"

  local options=(--project="$PROJECT" --region="$REGION" --temp_location="$TEMP_LOCATION")
  options+=(--job_name="$JOB_NAME" --extra_package="$sdist")
  [[ -z "${MAX_WORKERS:-}" ]] || options+=(--max_num_workers="$MAX_WORKERS")
  [[ -z "${MACHINE_TYPE:-}" ]] || options+=(--worker_machine_type="$MACHINE_TYPE")
  [[ -z "${DISK_GB:-}" ]] || options+=(--disk_size_gb="$DISK_GB")

  run "$PYTHON" -m build --sdist --outdir "$DATAFLOW_DIST" "$repo"
  [[ "${DRY_RUN:-0}" == 1 || -f "$sdist" ]] || die "python -m build wrote no $sdist"
  run "$PYTHON" -m "bertjax.$module" --runner=DataflowRunner \
    --beam_pipeline_options="$(shell_quote "${options[@]}")" "$@"
}
