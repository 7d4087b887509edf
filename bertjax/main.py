"""Pretrains BERT: ``python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/tiny``.

Config overrides work as usual, e.g. ``--config.optimizer.learning_rate=5e-5``; with
``--config.init_checkpoint`` the checkpoint decides the model and vocab, and the
``--config.model.*`` and ``--config.data.vocab_file`` flags given must agree with it
(``bertjax.pretrain.continued``; this module hands it the keys the command line set).
Multi-process runs (TPU pod slices) call ``jax.distributed.initialize()``: automatically on a
Cloud TPU VM (the hosts of the slice come from the TPU metadata), or explicitly with
``--coordinator_address``, ``--num_processes``, ``--process_id`` (e.g. two local CPU processes).
Re-running the same command resumes from the workdir's latest checkpoint; SIGTERM saves a
checkpoint and exits 0. Errors in the config or inputs print one line, exit 1.
"""

from __future__ import annotations

from absl import flags, logging
from ml_collections import config_flags

from bertjax import cli, startup


def _define_flags() -> None:
    """Only when run as a command, so importing this module adds no flags."""
    config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
    flags.DEFINE_string(
        "workdir",
        None,
        "Directory (local or gs://) for checkpoints, TensorBoard and the exported config.",
    )
    flags.DEFINE_string(
        "coordinator_address", None, "host:port of process 0 for jax.distributed.initialize."
    )
    flags.DEFINE_integer("num_processes", None, "Number of processes.")
    flags.DEFINE_integer("process_id", None, "This process's index.")
    flags.DEFINE_enum(
        "distributed",
        "auto",
        ["auto", "true", "false"],
        "Call jax.distributed.initialize() with the cluster's auto-detection. auto: on a Cloud "
        "TPU VM (it reads the slice's hosts from the TPU metadata; one host is a cluster of one).",
    )
    flags.mark_flags_as_required(["config", "workdir"])


def _train(flag_values: flags.FlagValues) -> None:
    if not flag_values["verbosity"].present:
        # Orbax logs every save at INFO; the user's view is the one-line-per-log_every output.
        logging.set_verbosity(logging.WARNING)
    startup.hide_accelerators_from_tensorflow()
    startup.initialize_distributed(
        flag_values.coordinator_address,
        flag_values.num_processes,
        flag_values.process_id,
        flag_values.distributed,
    )
    from bertjax.pretrain import loop  # noqa: PLC0415 - after distributed init

    # The config keys set by --config.x=y flags: with config.init_checkpoint, the checkpoint
    # decides the model fields and the vocab, and these must agree with it.
    command_line = config_flags.get_override_values(flag_values["config"])
    loop.train_and_evaluate(flag_values.config, flag_values.workdir, command_line=command_line)


def main() -> None:  # also the console script bertjax-pretrain
    # Config and input errors (ValueError, checkpoint.CheckpointError) and a non-finite step.
    cli.run(_train, _define_flags, errors=(ValueError, FloatingPointError), prog="main")


if __name__ == "__main__":
    main()
