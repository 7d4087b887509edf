#!/usr/bin/env bash
# Installs Python >= 3.11 and bertjax (extras `tpu` and `gcs`) on every worker of a TPU VM slice.
# create_tpu_vm.sh runs it once the slice is ACTIVE; rerun it alone to ship new code.
#
#   TPU_NAME=bert-pod ZONE=us-central2-b bash launch/setup_tpu_vm.sh
#
# Required: TPU_NAME (the TPU VM node), ZONE.
# Optional:
#   REPO            a local checkout (default: this repository), tarred without .git and copied
#                   to every worker with scp, or a git URL cloned on every worker at REF
#   REF             branch, tag or commit for a git REPO (default: main)
#   PYTHON_VERSION  default 3.11 (bertjax needs >= 3.11; every TPU runtime's python3 is 3.10)
#   PROJECT         gcloud project (default: gcloud's configured one)
#   DRY_RUN=1       print the commands instead of running them
#
# On each worker: uv (pip-installed into ~/.local, or its installer when pip is missing) makes
# ~/bertjax-venv with Python PYTHON_VERSION (uv downloads a standalone build), then
# `uv pip install -c ~/bertjax/constraints.txt -e ~/bertjax[tpu,gcs]` (the tested versions; gcs:
# the workdir lease on gs://). Rerunning replaces ~/bertjax and reuses the venv.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
handle_help "$@"
no_arguments "$@"

require TPU_NAME "the TPU VM name, as given to create_tpu_vm.sh"
require ZONE "the TPU zone, e.g. us-central2-b"
REPO="${REPO:-$(cd "$LAUNCH_DIR/.." && pwd)}"
REF="${REF:-main}"
PYTHON_VERSION="${PYTHON_VERSION:-3.11}"
[[ "$PYTHON_VERSION" =~ ^3\.(1[1-9]|[2-9][0-9])$ ]] \
  || die "PYTHON_VERSION=$PYTHON_VERSION: bertjax needs Python 3.11 or newer (e.g. 3.11, 3.12)"

tarball_name=bertjax-src.tgz
if [[ -d "$REPO" ]]; then
  [[ -f "$REPO/setup.cfg" ]] || die "REPO=$REPO is a directory without setup.cfg (not a bertjax checkout)"
  tmp_dir="$(mktemp -d)"
  trap 'rm -rf "$tmp_dir"' EXIT
  run tar -C "$REPO" --exclude=.git --exclude=.venv --exclude=__pycache__ --exclude='*.egg-info' \
    --exclude=.pytest_cache --exclude=.ruff_cache -czf "$tmp_dir/$tarball_name" .
  # A relative remote path is the worker's home directory.
  gcloud_zone compute tpus tpu-vm scp "$tmp_dir/$tarball_name" "$TPU_NAME:$tarball_name" --worker=all
  fetch="rm -rf $REMOTE_SRC; mkdir -p $REMOTE_SRC; tar -xzf \$HOME/$tarball_name -C $REMOTE_SRC"
  fetch+="; rm -f \$HOME/$tarball_name"
elif [[ "$REPO" == /* || "$REPO" == .* ]]; then
  die "REPO=$REPO does not exist (give a local checkout or a git URL)"
else
  fetch="rm -rf $REMOTE_SRC; git clone --quiet $(shell_quote "$REPO") $REMOTE_SRC"
  fetch+="; git -C $REMOTE_SRC checkout --quiet $(shell_quote "$REF")"
fi

python="$REMOTE_VENV/bin/python"
wanted="($(tr . , <<<"$PYTHON_VERSION"))"
# One line, so that DRY_RUN prints one line per command; the worker's login shell is bash.
remote="set -euo pipefail; export PATH=\$HOME/.local/bin:\$PATH; $fetch"
remote+="; if ! command -v uv >/dev/null; then python3 -m pip install --user --quiet uv"
remote+=" || curl -LsSf https://astral.sh/uv/install.sh | sh; fi"
remote+="; if ! $python -c 'import sys; sys.exit(sys.version_info[:2] != $wanted)' 2>/dev/null"
remote+="; then rm -rf $REMOTE_VENV; uv venv --quiet --python $PYTHON_VERSION $REMOTE_VENV; fi"
remote+="; uv pip install --quiet --python $python -c \"${REMOTE_SRC}/constraints.txt\""
remote+=" -e \"${REMOTE_SRC}[tpu,gcs]\""
remote+="; $python -c 'import platform, jax, bertjax; print(platform.node(), \"python\","
remote+=" platform.python_version(), \"jax\", jax.__version__, \"bertjax ready\")'"
gcloud_zone compute tpus tpu-vm ssh "$TPU_NAME" --worker=all --command="$remote"
