"""The special tokens of a BERT vocab, by name: ``[PAD] [UNK] [CLS] [SEP] [MASK]``.

Tokenizers find them by name in any vocab (Google's release has them at 0 and 100-103);
``bertjax.vocab`` writes them first, as ids 0-4 in this order; HF exports name them in their
tokenizer config. No TensorFlow here, so that interop code reads them without importing it.
"""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
