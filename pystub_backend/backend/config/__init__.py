"""The model configuration every layer reads: `config.pbtxt` parsed, normalized and checked the
way Triton does (model_config), and the sequence batcher's control inputs it declares
(sequence_controls). It imports no other backend package but the shared vocabulary, so the
schedulers, models, features and frontends can all read a config without importing each other.

Import what you use from the modules listed below (the package imports none of them itself).
"""

__all__ = ["model_config", "sequence_controls"]
