"""Checkpoint interop as a library: HuggingFace and Google's original TF1 BERT <-> bertjax.

``python -m bertjax.convert`` is the command over it; fine-tuning and pretraining
(``config.init_checkpoint``; ``bertjax.pretrain.continued``) and ``extract_features`` read any
checkpoint through :func:`bertjax.interop.formats.load`.

* ``converted``: :class:`Converted` (a checkpoint in memory: unscanned numpy params, BertConfig,
  vocab, casing, a fine-tuned model's task) and :class:`ConvertError`.
* ``mapping``: the name table, every weight's bertjax path, HF and TF1 names, shape and
  orientation, and the ``config.json`` fields.
* ``hf``: HF directories, read and written (``BertModel``, ``BertForPreTraining`` and the four
  fine-tuning classes, with their labels).
* ``tf1``: Google's original release, read.
* ``native``: bertjax params-only checkpoints (read, written) and training workdirs (read).
* ``formats``: detecting a path's format, :func:`load`, :func:`save`, :func:`convert`.

Stage: above ``training`` (it reads and writes ``training.checkpoint``'s layouts) and below
``pretrain``/``finetune``; it never imports a command module.
"""
