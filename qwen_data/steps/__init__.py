"""The steps a record goes through in a worker: pretraining text → ids + eod; a chat → samples with loss masks."""
