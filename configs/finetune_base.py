"""Every fine-tuning configuration key, with its default (the paper's §4 hyper-parameters).

The same sections and names as pretraining's (configs/base.py) for the same things: ``model``,
``data``, ``train``, ``optimizer``, ``checkpoint``, ``mesh``; what only a fine-tuning task has
is in ``task``; the paper's selection grid in ``sweep``. The architecture comes from the
checkpoint. The task configs (finetune_glue.py, finetune_squad.py, finetune_ner.py,
finetune_swag.py) call ``get_config`` and change only what differs. A key of the old flat
schema (``--config.batch_size``) is one line naming its new key (bertjax.finetune.schema).

    python -m bertjax.finetune --config=configs/finetune_glue.py --config.task.name=mrpc \
        --config.task.data_dir=DIR --config.init_checkpoint=CKPT --workdir=OUT
"""

import ml_collections
from ml_collections.config_dict import FieldReference

from bertjax.training import sharding


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.mode = "train"  # train | predict | sweep | feature_based (see the section below)
    config.init_checkpoint = ""  # bertjax params-only dir, HuggingFace dir or TF1 checkpoint
    config.seed = 0  # head init, shuffling and dropout

    # ---- task (owner: bertjax.finetune.tasks and the task modules) ----
    config.task = ml_collections.ConfigDict()
    # glue: cola sst2 mrpc stsb qqp mnli qnli rte wnli; squad_v1 squad_v2; conll2003; swag
    config.task.name = ""
    config.task.data_dir = ""  # the task's standard files (see each task module's docstring)
    # files: the standard files in data_dir | tfds: a locally prepared TFDS glue/<task> (GLUE only)
    config.task.source = "files"
    config.task.tfds_data_dir = ""  # source='tfds': its data_dir ('' = TFDS's default)
    config.task.predict_checkpoint = ""  # predict mode: fine-tuned checkpoint ('' = WORKDIR/...)
    # SQuAD (run_squad.py's flags).
    config.task.doc_stride = 128
    config.task.max_query_length = 64
    config.task.n_best_size = 20
    config.task.max_answer_length = 30
    # v2.0: predict "" when null score - best span score > this (dev also writes
    # predictions_best_thresh.json at evaluate-v2.0.py's best_f1_thresh; see finetune/squad.py)
    config.task.null_score_diff_threshold = 0.0

    # ---- model: only these BertConfig fields may differ from the checkpoint's ----
    config.model = ml_collections.ConfigDict()
    config.model.hidden_size = 0  # 0: any; otherwise must equal the checkpoint's (a sanity check)
    config.model.hidden_dropout_rate = 0.1
    config.model.attention_dropout_rate = 0.1
    config.model.dtype = "float32"
    config.model.scan_layers = False
    config.model.remat_policy = "none"
    config.model.attention_impl = "auto"  # auto | xla | fused (see configs/base.py)
    config.model.attention_check = True  # the fused kernel's self-check (see configs/base.py)
    # A randomly initialised BiLSTM between the encoder and the task head (the paper's Table 5
    # "+ BiLSTM"; bertjax/model/heads.py): none | bilstm. Token heads (tagging, span) score its
    # outputs, sentence heads its final forward and backward states. HF export has no class for it.
    config.model.head_rnn = "none"
    config.model.head_rnn_size = 0  # units per direction; 0 = the encoder's hidden size
    config.model.head_rnn_layers = 1

    # ---- data ----
    config.data = ml_collections.ConfigDict()
    config.data.max_seq_length = 128
    # None: the checkpoint's casing (its record, or what its vocab implies); true | false to force
    config.data.do_lower_case = FieldReference(None, field_type=bool)
    # Sequence packing (bertjax/finetune/packed.py): GLUE and NER put up to max_sequences_per_pack
    # examples in a row, each attending only to itself; batch sizes still count examples.
    config.data.pack_sequences = False
    config.data.max_sequences_per_pack = 8

    # ---- train ----
    config.train = ml_collections.ConfigDict()
    config.train.global_batch_size = 32  # examples per update, over all hosts (paper: 32)
    config.train.eval_batch_size = 64
    config.train.num_epochs = 3.0
    config.train.log_every = 50
    # Split each update into this many micro-batches whose gradients are summed (the same update
    # as the whole batch, less activation memory).
    config.train.grad_accum_steps = 1
    # On a non-finite loss or gradient: False = stop with an error naming the step; True = skip
    # the update (params and optimizer state unchanged) and count it.
    config.train.skip_nonfinite = False
    config.train.peak_flops = 0.0  # one device's peak FLOP/s for MFU; 0 = the accelerator table's

    # ---- optimizer (bertjax.training.optimizer; warmup_steps comes from warmup_proportion) ----
    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "bert_adamw"  # the original AdamWeightDecayOptimizer
    config.optimizer.learning_rate = 2e-5  # paper: best of {5e-5, 4e-5, 3e-5, 2e-5} on dev (sweep)
    config.optimizer.warmup_proportion = 0.1  # linear warmup over this fraction of the steps
    config.optimizer.schedule = "linear"
    config.optimizer.beta1 = 0.9
    config.optimizer.beta2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.max_grad_norm = 1.0

    # The train state is saved into the workdir as pretraining's is (bertjax.training.checkpoint):
    # rerunning the command resumes from the newest verified step; SIGTERM saves and exits 0.
    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 1000
    config.checkpoint.keep = 1
    config.checkpoint.keep_every = 0  # multiples of it kept for good, outside keep (0: off)
    config.checkpoint.async_save = True
    # The workdir's lease (bertjax.training.lease): renewed every lease_renew_seconds; a holder
    # silent for lease_ttl_seconds may be taken over by another run.
    config.checkpoint.lease_ttl_seconds = 120.0
    config.checkpoint.lease_renew_seconds = 30.0

    # The paper's selection: every learning rate x num_restarts seeds, the best on dev kept.
    config.sweep = ml_collections.ConfigDict()
    config.sweep.learning_rates = (5e-5, 4e-5, 3e-5, 2e-5)
    config.sweep.num_restarts = 1  # the paper restarted BERT-LARGE on small sets; raise for that

    # The paper's feature-based approach (Table 7; bertjax/finetune/feature_based.py), mode
    # feature_based: the encoder runs once over every split and stays frozen; one head per layer
    # combination (a BiLSTM, then the task's classifier) trains on those activations.
    # Comma-separated: embeddings | second_to_last | last | last_four_sum | last_four_concat |
    # all_sum, or 'all' for the six (*_sum: a learned softmax-weighted sum, ELMo's scalar mix).
    config.feature_based = ml_collections.ConfigDict()
    config.feature_based.layers = "last_four_concat"
    config.feature_based.rnn_size = 768  # the head's BiLSTM units per direction (paper: 768)
    config.feature_based.rnn_layers = 2  # paper: two layers
    config.feature_based.restarts = 1  # heads per combination, seeds config.seed, +1, ...
    # Where the activations are kept (one .npy per layer and split, local disk); '' = WORKDIR/
    # activations. A run with the same checkpoint, task data and length reuses them.
    config.feature_based.activations_dir = ""

    # The device mesh, as in pretraining (configs/base.py): ('data', 'fsdp', 'tensor') sizes, one
    # -1 takes the remaining devices; logical axis -> mesh axes rules (bertjax.training.sharding).
    config.mesh = ml_collections.ConfigDict()
    config.mesh.shape = (-1, 1, 1)
    config.mesh.rules = sharding.DEFAULT_RULES
    return config.lock()
