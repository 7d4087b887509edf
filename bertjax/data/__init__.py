"""Stage 1, text -> batches, on the host. No JAX is imported anywhere in this package.

Modules in the order data flows through them:

* ``bundled``: the default corpus and vocab that ship with the package (``corpus/``).
* ``special_tokens``: the five a vocab has, by name (no TensorFlow).
* ``tokenization`` (+ ``unicode_tables``): in-graph WordPiece / SentencePiece on tensorflow-text,
  ids identical to HuggingFace ``BertTokenizerFast``.
* ``vocab``: building a WordPiece vocab or a SentencePiece model from a corpus.
* ``sources``: input globs, the cached instance table of a text/TFDS corpus, work units.
* ``instances``: documents -> unmasked A/B instances (NSP pairing), as the original.
* ``masking``: seeded 80/10/10 MLM masking on numpy batches.
* ``tfrecords``: the original BERT TFRecord format: writing, checking, per-host reading.
* ``pipeline``: the per-host ``tf.data`` pipeline; its docstring is the batch contract.
* ``offline``: corpus -> sharded masked TFRecords in parallel worker processes (``work_units``:
  the corpus cut; ``shard_pieces``: each unit's part of the shards, checked before it is
  appended; ``offline_beam``: the same on Apache Beam).
* ``stats``: what a user needs to trust a dataset (mask rate, NSP balance, lengths, ...).
"""
