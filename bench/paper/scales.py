"""The two scales of the paper miniature: ``smoke`` (the plumbing, minutes) and ``full`` (hours on
a 2-core CPU machine). Both run the same plan (``bench.paper.plan``); only these numbers differ.

Where the full scale's numbers come from is in bench/paper/README.md ("How long it takes"): a
pilot at this scale's model measured on the 2-core machine under ``nice`` and the estimate built
from it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    heads: int


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str
    corpus_files: tuple[str, ...]  # pretraining input, under the data's corpus/
    vocab_files: tuple[str, ...]  # the WordPiece vocab is learnt on these (corpus/)
    vocab_size: int
    main_size: Size  # bert, no_nsp, ltr and no_pretraining
    ladder: tuple[Size, ...]  # Table 6; main_size is one of them
    max_seq_length: int
    max_predictions: int  # MLM's P (LTR predicts every position)
    pretrain_batch: int
    pretrain_steps: int
    pretrain_learning_rate: float
    pretrain_warmup: int
    eval_every: int  # held-out evaluation and a kept checkpoint (the curves' x axis)
    eval_batches: int
    continue_steps: int  # all-MiniLM-L6-v2 continued on the corpus
    continue_warmup: int
    curve_steps: tuple[int, ...]  # pretraining steps fine-tuned from (the last is the run's end)
    curve_tasks: tuple[str, ...]
    train_examples: int  # N of each task's train split, spread over it (0 = all)
    dev_examples: int  # N of each dev split, spread over it (0 = all)
    finetune_seq_length: int
    finetune_batch: int
    finetune_epochs: float
    learning_rates: tuple[float, ...]
    ceiling_learning_rates: tuple[float, ...]  # minilm_continued's sweep (~20x a small model's)
    restarts: int  # seeds per learning rate: the spread over seeds
    ceiling_restarts: int  # minilm_continued's
    feature_learning_rate: float  # Table 7's BiLSTM heads on frozen activations
    # Tasks whose train subsets differ from train_examples (SQuAD: ~3 windows a question).
    train_examples_by_task: tuple[tuple[str, int], ...] = ()
    # Tasks fine-tuned for other than finetune_epochs: about as many updates as the others.
    finetune_epochs_by_task: tuple[tuple[str, float], ...] = ()

    def train_examples_of(self, task: str) -> int:
        return dict(self.train_examples_by_task).get(task, self.train_examples)

    def epochs_of(self, task: str) -> float:
        return dict(self.finetune_epochs_by_task).get(task, self.finetune_epochs)

    def steps_of(self, model: str) -> int:
        """Pretraining steps behind ``model`` (a ``plan`` pretraining name)."""
        if model == "no_pretraining":
            return 0
        return self.continue_steps if model == "minilm_continued" else self.pretrain_steps


_SHARDS = tuple(f"train-0000{i}-of-00008.txt.gz" for i in range(8))

SCALES = {
    "smoke": Scale(
        name="smoke",
        corpus_files=_SHARDS[:1],
        vocab_files=("eval.txt.gz",),  # 1 MB: a minute where a 6.5 MB shard takes several
        vocab_size=2000,
        main_size=Size(2, 64, 2),
        ladder=(Size(1, 32, 2), Size(2, 64, 2), Size(2, 96, 2)),
        max_seq_length=64,
        max_predictions=10,
        pretrain_batch=16,
        pretrain_steps=20,
        pretrain_learning_rate=5e-4,
        pretrain_warmup=5,
        eval_every=10,
        eval_batches=2,
        continue_steps=4,
        continue_warmup=2,
        curve_steps=(10,),
        curve_tasks=("qnli",),
        train_examples=64,
        dev_examples=32,
        finetune_seq_length=64,
        finetune_batch=16,
        finetune_epochs=1.0,
        learning_rates=(1e-4,),
        ceiling_learning_rates=(1e-4,),
        restarts=1,
        ceiling_restarts=1,
        feature_learning_rate=1e-3,
    ),
    "full": Scale(  # the time it takes: bench/paper/README.md
        name="full",
        corpus_files=_SHARDS,
        vocab_files=_SHARDS,
        vocab_size=8192,
        main_size=Size(2, 128, 2),
        ladder=(Size(1, 64, 2), Size(2, 128, 2), Size(3, 160, 2)),
        max_seq_length=128,
        max_predictions=20,
        pretrain_batch=32,
        pretrain_steps=4000,
        pretrain_learning_rate=1e-3,
        pretrain_warmup=400,
        eval_every=500,
        eval_batches=8,
        continue_steps=100,
        continue_warmup=10,
        curve_steps=(500, 1000, 2000),
        # SQuAD joined QNLI after QNLI's gate failed, before any curve run (bench/paper/README.md,
        # "The protocol"): a curve on a task no model learns here shows nothing.
        curve_tasks=("qnli", "squad"),
        train_examples=4000,
        dev_examples=1000,
        finetune_seq_length=128,
        finetune_batch=32,
        finetune_epochs=3.0,
        learning_rates=(1e-4, 3e-4),
        ceiling_learning_rates=(3e-5,),  # bench/paper/README.md: 1e-4 left MiniLM at chance
        restarts=2,
        ceiling_restarts=1,
        feature_learning_rate=1e-3,
        train_examples_by_task=(("squad", 2000),),
        # WNUT-16's subset is 1,351 tweets, packed ~11 a row: 3 epochs are 124 updates where
        # QNLI's 4,000 pairs make 375. 9 epochs make ~372 (bench/paper/README.md, "The protocol").
        finetune_epochs_by_task=(("wnut16", 9.0),),
    ),
}
