"""``python -m bertjax.finetune --config=configs/finetune_glue.py --workdir=OUT [--config.x=...]``.

Thin entry point: parses flags and dispatches on ``config.mode`` (see ``bertjax.finetune.train``).
Bad input is printed as one line and exits non-zero.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import cpu_malloc
from bertjax.checkpoint import CheckpointError
from bertjax.convert import ConvertError
from bertjax.finetune.tasks import FinetuneInputError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "fine-tuning config file", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory")
flags.mark_flags_as_required(["config", "workdir"])

MODES = ("train", "predict", "sweep")


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.info("%s", cpu_malloc.status())
    from bertjax.finetune import sweep, train

    config, workdir = _CONFIG.value, _WORKDIR.value
    try:
        if config.mode not in MODES:
            raise FinetuneInputError(f"config.mode={config.mode!r}: expected one of {MODES}")
        if config.mode == "train":
            results = train.train_and_evaluate(config, workdir)
            logging.info("dev results: %s", results["dev"])
        elif config.mode == "predict":
            logging.info("wrote %s", train.predict(config, workdir))
        else:
            logging.info("sweep best: %s", sweep.sweep(config, workdir)["best"])
    except (FinetuneInputError, CheckpointError, ConvertError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cpu_malloc.reexec_with_huge_pages()  # once, before any work (see bertjax.cpu_malloc)
    app.run(main)
