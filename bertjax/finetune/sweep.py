"""The paper's hyper-parameter selection: learning rates x random restarts, best dev score wins.

Every run starts from the same pretrained checkpoint; a restart changes the seed, i.e. the data
shuffling, the head initialisation and the dropout masks. Writes ``sweep_results.md`` (the table)
and ``sweep_results.json`` into the workdir, and the best run's checkpoint, dev predictions and
test predictions as ``train_and_evaluate`` does. Each run trains in its own training workdir,
``WORKDIR/sweep_runs/lr<rate>_seed<seed>/`` (train state, record, lease: as a ``train`` run's), so
an interrupted sweep resumes where it stopped: finished runs are only re-evaluated, and the
model comes from the first run's record, the init checkpoint read only if a run has no verified
step (``bertjax.training.init_record``).
"""

from __future__ import annotations

import os

import jax

from bertjax import atomic
from bertjax.finetune import inputs
from bertjax.finetune import loop as T
from bertjax.finetune import objective as objective_lib

RUNS_DIR = "sweep_runs"  # WORKDIR/sweep_runs/lr<rate>_seed<seed>/: each run's training workdir


def _table(rows: list[dict], metric: str, best: int) -> str:
    metric_names = sorted({k for r in rows for k in r["dev"] if "/num_" not in k})
    header = ["learning_rate", "seed", "final_train_loss", *metric_names, "selected"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        cells = [f"{row['learning_rate']:g}", str(row["seed"]), f"{row['final_train_loss']:.4f}"]
        cells += [f"{row['dev'].get(m, float('nan')):.2f}" for m in metric_names]
        cells.append("**best**" if i == best else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nselected by dev `{metric}` (first dev split)\n"


def _run_dir(workdir: str, learning_rate: float, seed: int) -> str:
    return os.path.join(workdir, RUNS_DIR, f"lr{learning_rate:g}_seed{seed}")


def sweep(config, workdir: str) -> dict:
    """Runs the grid; returns {"rows": [...], "best": index}."""
    # A resumed sweep takes the model from its first run's record, and reads the init checkpoint
    # only if a run has no verified step (bertjax.training.init_record).
    first = _run_dir(workdir, config.sweep.learning_rates[0], config.seed)
    task, pretrained, bert_config, vocab_file, lower, tokenizer = inputs.prepare(
        config, workdir=first
    )
    rnn = objective_lib.head_rnn(config, bert_config)  # a bad head_rnn fails before the data
    test_splits = inputs.existing_splits(task, config, task.test_splits)
    data = inputs.Data(task, config, tokenizer, [task.train_split, *task.dev_splits, *test_splits])
    model = objective_lib.build_model(task, bert_config, rnn)
    train_features = data.features[task.train_split]
    run_config, train_rows = T.pack_train(config, task, train_features)
    rows, best, best_params, predictor = [], -1, None, None
    for learning_rate in config.sweep.learning_rates:
        for restart in range(config.sweep.num_restarts):
            seed = config.seed + restart
            run_dir = _run_dir(workdir, learning_rate, seed)
            params, init = inputs.initial_params(
                model, pretrained, train_features.arrays, jax.random.key(seed), run_dir
            )
            fitted = T.fit(
                run_config, task, model, params, train_rows,
                workdir=run_dir, learning_rate=learning_rate,
                seed=seed, bert_config=bert_config, vocab_file=vocab_file, lower=lower,
                init=init, from_record=pretrained.from_record,
            )  # fmt: skip
            if fitted.stopped:
                print(f"stopped: rerun the same command to resume the sweep in {workdir}")
                return {"stopped": True}
            if predictor is None:
                predictor = T.predictor_for(
                    run_config, task, model, train_features.arrays, fitted.mesh
                )
            dev = T.evaluate_and_write(
                predictor, task, fitted.params, data, task.dev_splits, out_dir=None
            )
            rows.append(_row(learning_rate, seed, fitted.final_loss, dev))
            score = dev[task.dev_splits[0]][task.primary_metric]
            print(
                f"sweep lr={learning_rate:g} seed={seed}: dev {task.primary_metric} {score:.2f}",
                flush=True,
            )
            if best < 0 or score > rows[best]["score"]:
                best, best_params = len(rows) - 1, fitted.params
            rows[-1]["score"] = score
    result = {
        "task": task.name,
        "primary_metric": task.primary_metric,
        "rows": rows,
        "best": best,
        "batch_size": config.train.global_batch_size,
        "num_train_epochs": config.train.num_epochs,
    }
    with T.staged_outputs(workdir) as stage:  # all or nothing, the tables last
        T.save(stage, best_params, bert_config, vocab_file, lower, task)
        out_dir = os.path.join(stage, "predictions")
        T.evaluate_and_write(predictor, task, best_params, data, task.dev_splits, out_dir)
        T.evaluate_and_write(
            predictor, task, best_params, data, test_splits, out_dir, with_labels=False
        )
        T.write_json(os.path.join(stage, "sweep_results.json"), result)
        atomic.write_text(
            os.path.join(stage, "sweep_results.md"), _table(rows, task.primary_metric, best)
        )
    return result


def _row(learning_rate: float, seed: int, final_loss: float, dev: dict) -> dict:
    return {
        "learning_rate": learning_rate,
        "seed": seed,
        "final_train_loss": final_loss,
        "dev": {
            f"{s}/{k}": v
            for s, m in dev.items()
            for k, v in m.items()
            if isinstance(v, int | float)
        },
    }
