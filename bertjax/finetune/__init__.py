"""Fine-tuning on GLUE, SQuAD, CoNLL-2003 NER and SWAG (paper §4); see train.py."""
