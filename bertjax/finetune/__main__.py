"""``python -m bertjax.finetune --config=configs/finetune_glue.py --workdir=OUT [--config.x=...]``.

Thin entry point: parses flags and dispatches on ``config.mode`` (see ``bertjax.finetune.loop``;
``feature_based``: ``bertjax.finetune.feature_based``).
Bad input is printed as one line and exits 1.
"""

from __future__ import annotations

from absl import flags, logging
from ml_collections import config_flags

from bertjax import cli
from bertjax.finetune import schema

MODES = ("train", "predict", "sweep", "feature_based")


def _define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "fine-tuning config file", lock_config=True)
    flags.DEFINE_string("workdir", None, "output directory")
    flags.mark_flags_as_required(["config", "workdir"])


def _run(flag_values: flags.FlagValues) -> None:
    from bertjax.finetune import feature_based, loop, sweep
    from bertjax.finetune.tasks import FinetuneInputError

    if not flag_values["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # the user's view is the printed progress lines
    config, workdir = flag_values.config, flag_values.workdir
    if config.mode not in MODES:
        raise FinetuneInputError(f"config.mode={config.mode!r}: expected one of {MODES}")
    if config.mode == "train":
        loop.train_and_evaluate(config, workdir)
    elif config.mode == "predict":
        print(f"wrote {', '.join(loop.predict(config, workdir))}", flush=True)
    elif config.mode == "feature_based":
        feature_based.run(config, workdir)
    else:
        sweep.sweep(config, workdir)


def main() -> None:  # also the console script bertjax-finetune
    # FinetuneInputError, CheckpointError and ConvertError are ValueErrors.
    cli.run(_run, _define_flags, prog="finetune", renamed=schema)


if __name__ == "__main__":
    main()
