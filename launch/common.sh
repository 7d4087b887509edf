# shellcheck shell=bash
# Shared by launch/*.sh (sourced, never run): errors, --help, DRY_RUN, the gcloud call, the
# accelerator -> runtime mapping and the paths on the workers.

set -euo pipefail

SCRIPT_NAME="$(basename "$0")"
# shellcheck disable=SC2034  # used by the scripts that source this file
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Paths on every worker, written unexpanded: the worker's shell expands $HOME.
# shellcheck disable=SC2016,SC2034
{
  REMOTE_SRC='$HOME/bertjax'  # the code (tarball or git checkout), installed editable
  REMOTE_VENV='$HOME/bertjax-venv'  # Python >= 3.11 made by uv; the runtime's python3 is 3.10
  REMOTE_LOGS='$HOME/bertjax-logs'  # <run>.log per run, latest.log -> the newest, bertjax.pid
}

# One line on stderr, exit 1.
die() {
  printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
  exit 1
}

# The script's header comment: line 2 up to the first line that is not a comment, without the
# directives for shellcheck.
usage() {
  sed -n '2,/^[^#]/{/^# shellcheck /d;/^#/{s/^# \{0,1\}//;p;}}' "$0"
}

# --help/-h prints the usage and exits 0; other arguments are the caller's to check.
handle_help() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      -h | --help) usage; exit 0 ;;
    esac
  done
}

no_arguments() {
  [[ $# -eq 0 ]] || die "unexpected argument '$1' (settings are environment variables, see --help)"
}

# require VAR 'what it is': a one-line error when VAR is unset or empty.
require() {
  [[ -n "${!1:-}" ]] || die "set $1 ($2)"
}

# Words quoted for a POSIX shell: bare when safe, else in single quotes; one line for a command.
shell_quote() {
  local word quoted=()
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      quoted+=("$word")
    else
      quoted+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  printf '%s' "${quoted[*]}"
}

# Runs a command, or with DRY_RUN=1 prints it as `+ cmd args...` (shell-quoted) instead.
run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '+ %s\n' "$(shell_quote "$@")"
  else
    "$@"
  fi
}

# gcloud with the zone and, when PROJECT is set, the project; through run().
gcloud_zone() {
  local project=()
  [[ -z "${PROJECT:-}" ]] || project=(--project="$PROJECT")
  run gcloud "$@" --zone="$ZONE" "${project[@]}"
}

# TPU software version for an accelerator type. Cloud TPU docs, "TPU software versions"
# (cloud.google.com/tpu/docs/runtimes), PyTorch and JAX table: v6e (Trillium) v2-alpha-tpuv6e,
# v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base. All four are
# Ubuntu 22.04 images whose python3 is 3.10 (none ships 3.11; the tpu-vm-tf-* images are for
# TensorFlow only), so setup_tpu_vm.sh installs Python >= 3.11 with uv on every worker.
runtime_for_accelerator() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v2-* | v3-* | v4-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}
