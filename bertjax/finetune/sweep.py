"""The paper's hyper-parameter selection: learning rates x random restarts, best dev score wins.

Every run starts from the same pretrained checkpoint; a restart changes the seed, i.e. the data
shuffling, the head initialisation and the dropout masks. Writes ``sweep_results.md`` (the table)
and ``sweep_results.json`` into the workdir, and the best run's checkpoint, dev predictions and
test predictions as ``train_and_evaluate`` does.
"""

from __future__ import annotations

import os

import jax

from bertjax import atomic
from bertjax.finetune import inputs
from bertjax.finetune import loop as T
from bertjax.finetune import step as step_lib


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


def sweep(config, workdir: str) -> dict:
    """Runs the grid; returns {"rows": [...], "best": index}."""
    task, pretrained, bert_config, vocab_file, lower, tokenizer = inputs.prepare(config)
    test_splits = inputs.existing_splits(task, config, task.test_splits)
    data = inputs.Data(task, config, tokenizer, [task.train_split, *task.dev_splits, *test_splits])
    os.makedirs(workdir, exist_ok=True)  # after reading: bad data leaves no trace in the workdir
    model = step_lib.build_model(task, bert_config)
    runner = step_lib.Runner(task, model, config)
    train_features = data.features[task.train_split]
    rows, best, best_params = [], -1, None
    for learning_rate in config.sweep.learning_rates:
        for restart in range(config.sweep.num_restarts):
            seed = config.seed + restart
            params = inputs.init_params(
                model, pretrained, train_features.arrays, jax.random.key(seed)
            )
            params, loss = T.fit(
                runner, params, train_features, learning_rate=learning_rate, seed=seed
            )
            dev = T.evaluate_and_write(runner, task, params, data, task.dev_splits, out_dir=None)
            first = dev[task.dev_splits[0]]
            rows.append(
                {
                    "learning_rate": learning_rate,
                    "seed": seed,
                    "final_train_loss": loss,
                    "dev": {
                        f"{s}/{k}": v
                        for s, m in dev.items()
                        for k, v in m.items()
                        if isinstance(v, int | float)
                    },
                }
            )
            print(
                f"sweep lr={learning_rate:g} seed={seed}: dev {task.primary_metric} "
                f"{first[task.primary_metric]:.2f}",
                flush=True,
            )
            score = first[task.primary_metric]
            if best < 0 or score > rows[best]["score"]:
                best, best_params = len(rows) - 1, params
            rows[-1]["score"] = score
    result = {
        "task": task.name,
        "primary_metric": task.primary_metric,
        "rows": rows,
        "best": best,
        "batch_size": config.batch_size,
        "num_train_epochs": config.num_train_epochs,
    }
    with T.staged_outputs(workdir) as stage:  # all or nothing, the tables last
        T.save(stage, best_params, bert_config, vocab_file, lower, task)
        out_dir = os.path.join(stage, "predictions")
        T.evaluate_and_write(runner, task, best_params, data, task.dev_splits, out_dir)
        T.evaluate_and_write(
            runner, task, best_params, data, test_splits, out_dir, with_labels=False
        )
        T.write_json(os.path.join(stage, "sweep_results.json"), result)
        atomic.write_text(
            os.path.join(stage, "sweep_results.md"), _table(rows, task.primary_metric, best)
        )
    return result
