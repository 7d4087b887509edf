"""Every configuration key of bertjax, with its default and what it means.

Variants (tiny.py, base.py-size, large.py, finetune_*.py) import ``get_config`` from here and
override only what differs. Library code reads ``config.x`` and never supplies its own defaults.

    python -m bertjax.main --config=configs/base.py --workdir=/tmp/bert
"""

import ml_collections
from ml_collections.config_dict import FieldReference

from bertjax.data import bundled, packing
from bertjax.training import sharding


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0

    # ---- model (owner: bertjax.model; fields of bertjax.model.config.BertConfig) ----
    config.model = ml_collections.ConfigDict()
    config.model.vocab_size = 30522
    config.model.hidden_size = 768
    config.model.num_layers = 12
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2
    config.model.hidden_dropout_rate = 0.1
    config.model.attention_dropout_rate = 0.1
    config.model.hidden_act = "gelu_tanh"  # original BERT's tanh GELU; 'gelu' = exact erf (HF)
    config.model.initializer_range = 0.02
    config.model.layer_norm_eps = 1e-12
    config.model.dtype = "float32"  # compute dtype; 'bfloat16' on TPU
    config.model.param_dtype = "float32"
    config.model.attention = "bidirectional"  # 'causal' = the paper's left-to-right ablation
    config.model.scan_layers = False
    # none | full | dots | dots_no_batch | dots_attention | attention (bertjax.model.config)
    config.model.remat_policy = "none"
    # auto: the Pallas flash kernels (attention dropout inside) on TPU and GPU (cuDNN on GPU for
    # 16-bit calls without dropout), XLA on CPU | xla | fused (auto's kernels; on CPU the TPU
    # kernel in interpret mode). The same function either way; resolved into a kernel for the
    # mesh's platform when the step is built (bertjax.model.attention).
    config.model.attention_impl = "auto"
    # Before the first step, a fused kernel is compared with the XLA path on the run's devices
    # (its head size, dtype, dropout rate and masks; forward and q/k/v gradients; ~2.5 s CPU time
    # on CPU, where 'fused' is the TPU kernel in interpret mode).
    # A kernel that differs makes the run use 'xla', with one warning line and a note in the
    # workdir's record (bertjax.training.kernel_check). False: no check.
    config.model.attention_check = True
    # Pretraining runs the last layer's queries, attention output, FFN and LayerNorms only at
    # [CLS] and the masked positions (the only ones the MLM/NSP heads read; keys and values still
    # see every position): the same loss and gradients (with dropout, the gathered rows draw
    # other masks of the same rate), ~(L-1-P)/L of one layer's work less (docs/benchmarks.md,
    # "The gathered last layer"). Unscanned layers only (scan_layers runs the last layer in
    # full). False: every position.
    config.model.gather_last_layer = True
    # bert | modernbert: ModernBERT's layers (pre-LayerNorm, RoPE, GLU, local attention on the
    # layers i with i % global_attn_every_n_layers != 0, final norm; bertjax.model.config). The
    # keys below shape 'modernbert' only; their defaults are ModernBERT-base's.
    config.model.architecture = "bert"
    config.model.global_attn_every_n_layers = 3
    config.model.local_attention = 128  # a local layer's keys: within 64 rows on each side
    config.model.global_rope_theta = 160000.0
    config.model.local_rope_theta = 10000.0
    config.model.attention_bias = False
    config.model.mlp_bias = False
    config.model.norm_bias = False
    config.model.head_bias = False
    config.model.decoder_bias = True
    config.model.head_act = "gelu"

    # ---- data (owner: bertjax.data.pipeline; batch contract in its docstring) ----
    config.data = ml_collections.ConfigDict()
    config.data.source = "text"  # text (BERT-format files) | tfds | tfrecord (pre-masked)
    # Glob(s) of training input: text (one sentence per line, blank line between documents,
    # .gz ok) or TFRecords. Default: the bundled King James corpus (bertjax/data). A list of
    # globs or one string of comma-separated globs; typed `object` so that both a config file's
    # list and the command line's `--config.data.input_files=a.txt,b/*.txt` are accepted.
    config.data.input_files = FieldReference([bundled.TRAIN_CORPUS], field_type=object)
    config.data.eval_input_files = FieldReference(  # held-out documents / TFRecords
        [bundled.EVAL_CORPUS], field_type=object
    )
    config.data.tfds_name = ""  # source='tfds': a prepared TFDS builder, e.g. 'wikipedia/...'
    config.data.tfds_data_dir = ""  # its local data_dir (nothing is downloaded)
    config.data.tfds_split = "train"
    config.data.tfds_eval_split = "validation"
    config.data.tfds_text_field = "text"  # one document per example, split into sentences
    config.data.vocab_file = bundled.VOCAB  # vocab.txt (wordpiece) or .model (sentencepiece)
    config.data.tokenizer = "wordpiece"  # wordpiece | sentencepiece
    config.data.do_lower_case = True
    config.data.max_seq_length = 128  # L; the paper: 128 for 90% of steps, then 512
    config.data.max_predictions_per_seq = 20  # P; 20 at L=128, 80 at L=512; = L for 'ltr'
    config.data.masked_lm_prob = 0.15
    config.data.short_seq_prob = 0.1  # probability of a shorter target length per document
    config.data.do_whole_word_mask = False  # mask all pieces of a word together
    # dynamic: fresh masks every epoch; static: dupe_factor pairings, one fixed mask each.
    config.data.masking = "dynamic"
    config.data.dupe_factor = 1  # pairings (and static masks) per document; the original used 10
    config.data.nsp = True  # False = the No-NSP ablation (single segments, label unused)
    config.data.objective = "mlm"  # mlm | ltr (left-to-right ablation: needs nsp=False, P = L)
    config.data.random_doc_pool = 1000  # documents around the current one to draw NotNext B from
    # A one-sentence chunk: False = always NotNext, as the original (IsNext 43.4% on the bundled
    # corpus at L=128); True = a coin flip, IsNext splitting the sentence in two (paper: 50/50).
    config.data.split_single_sentence = False
    # Packed rows (the batch contract's "packed row"; bertjax.data.packing): up to
    # max_sequences_per_pack (K) whole instances per row, none spent on padding. The online
    # text/tfds pipeline packs its instance table (pipeline.pack_table); source='tfrecord': the
    # records decide (create_pretraining_data --pack_sequences writes them) and these two must
    # agree with them. With packing, train.global_batch_size and eval_batch_size count
    # instances (the paper's 256) and the run derives the rows per step from the data's mean
    # instances per row (pretrain.inputs.resolve_packed_batch; printed at start).
    config.data.pack_sequences = False
    # K: one instance slot per 32 tokens, ceil(L / 32): 4 at 128, 16 at 512 (follows L when it is
    # overridden). A stub is a stub at any L, so the short instances a row can take grow with L:
    # on a corpus of many short documents at 512, K = 3 (NVIDIA's MLPerf BERT) left 17.0% of the
    # slots as padding, K = 16 0.6% (docs/benchmarks.md, "Sequence packing"); a slot costs one
    # [CLS] query of the gathered last layer.
    config.data.max_sequences_per_pack = (
        config.data.get_ref("max_seq_length") + packing.TOKENS_PER_SLOT - 1
    ) // packing.TOKENS_PER_SLOT
    config.data.shuffle_buffer = 10_000  # source='tfrecord': records in the shuffle buffer
    config.data.cache_dir = ""  # tokenized instance tables; '' = $TMPDIR/bertjax_data_cache

    # ---- train / optimizer / checkpoint / mesh / eval / logging (owner: bertjax.pretrain) ----
    # Continue pretraining from a checkpoint when the workdir has none: a bertjax checkpoint or
    # workdir, a HF BertModel / BertForPreTraining directory or a TF1 release. Its architecture,
    # vocab and casing replace config.model's and config.data's (bertjax.pretrain.continued;
    # configs/continue.py, docs/continued_pretraining.md).
    config.init_checkpoint = ""
    # A vocab that differs from the one the workdir or init_checkpoint was trained with is an
    # error (every embedding row would belong to another token); True accepts a deliberate
    # same-size change (with init_checkpoint: a data.vocab_file given on the command line).
    config.allow_vocab_change = False

    config.train = ml_collections.ConfigDict()
    config.train.num_steps = 1_000_000  # the run stops after this many optimizer updates
    config.train.global_batch_size = 256  # sequences per update, summed over all hosts
    # What the batch sizes count when data.pack_sequences is on: 'instances' (BERT's 256
    # sequences; the rows per step follow from the data's instances per row) or 'rows' (packed
    # rows of max_seq_length slots, ModernBERT's 4,608 x 1,024: tokens per step fixed whatever
    # the documents' lengths). Unpacked, an instance is a row and the two agree.
    config.train.batch_unit = "instances"
    # Split each update into this many micro-batches whose gradients are summed (same update as
    # the unaccumulated batch, less activation memory).
    config.train.grad_accum_steps = 1
    # Batch-size warm-up (ModernBERT's; bertjax.training.batch_schedule): the batch grows from
    # batch_warmup_start (global_batch_size's unit) through batch_warmup_stages evenly spaced
    # sizes, each held for the same number of steps, over batch_warmup_tokens (rows x L) tokens;
    # the learning-rate schedule then counts full-batch steps. 0 tokens = none.
    config.train.batch_warmup_tokens = 0
    config.train.batch_warmup_start = 0
    config.train.batch_warmup_stages = 4
    config.train.nsp_loss_weight = 1.0  # loss = mean MLM + this x mean NSP; 0 = No-NSP ablation
    config.train.log_every = 100  # steps between console / TensorBoard lines
    config.train.eval_every = 10_000  # steps between evaluations on held-out data; 0 = never
    config.train.eval_steps = 100  # max eval batches per evaluation (the eval stream is finite)
    config.train.eval_batch_size = 256  # global eval batch
    # On a non-finite loss or gradient: False = stop with an error naming the step; True = skip
    # the update (params and optimizer state unchanged) and count it.
    config.train.skip_nonfinite = False
    # Peak FLOP/s of ONE device for MFU; 0 = the table's dense bf16 peak for known TPUs/GPUs
    # (bertjax.training.accelerators); on CPU, 0 = no MFU (the log shows achieved GFLOP/s).
    config.train.peak_flops = 0.0
    # Random batches of the right shapes instead of config.data (benchmarks, smoke tests).
    config.train.synthetic_data = False

    config.optimizer = ml_collections.ConfigDict()
    # bert_adamw (original, no bias correction) | adamw | lamb | stable_adamw (ModernBERT's)
    config.optimizer.name = "bert_adamw"
    config.optimizer.learning_rate = 1e-4  # peak learning rate
    config.optimizer.warmup_steps = 10_000  # linear warmup from 0
    config.optimizer.schedule = "linear"  # linear: decay to 0 at decay_steps | constant | wsd
    # wsd (warmup-stable-decay): the last cooldown_steps of the schedule decay to 0, shaped
    # linear | 1-sqrt (bertjax.training.optimizer).
    config.optimizer.cooldown_steps = 0
    config.optimizer.cooldown_shape = "1-sqrt"
    # Length of the schedule; 0 = train.num_steps. Lets a two-phase recipe share one schedule.
    config.optimizer.decay_steps = 0
    config.optimizer.beta1 = 0.9
    config.optimizer.beta2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01  # decoupled; never on LayerNorm params or biases
    # stable_adamw: decay by (lr_t / learning_rate) * weight_decay, not lr_t * weight_decay.
    config.optimizer.fully_decoupled_decay = False
    config.optimizer.max_grad_norm = 1.0  # global-norm clipping; <= 0 disables

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 10_000  # async save of the full train state every N steps
    config.checkpoint.keep = 3  # keep the last K sealed steps (>= 1; bertjax.training.retention)
    # Also keep every step that is a multiple of N for good, outside `keep` (0: off): the steps a
    # curve is fine-tuned from survive preemption saves, which count in `keep`.
    config.checkpoint.keep_every = 0
    config.checkpoint.async_save = True  # write in a background thread while training goes on
    # The workdir's lease (bertjax.training.lease): renewed every lease_renew_seconds; a holder
    # silent for lease_ttl_seconds may be taken over by another run.
    config.checkpoint.lease_ttl_seconds = 120.0
    config.checkpoint.lease_renew_seconds = 30.0

    config.mesh = ml_collections.ConfigDict()
    # Sizes of the ('data', 'fsdp', 'tensor') mesh axes; one -1 takes the remaining devices.
    config.mesh.shape = (-1, 1, 1)
    # Logical axis -> mesh axes (see bertjax.training.sharding); the batch is split over data x
    # fsdp.
    config.mesh.rules = sharding.DEFAULT_RULES
    return config
