"""Checkpoint storage: the folder format, finding and loading checkpoints, the Hub.

- :mod:`~transformer_gmm.storage.format`: a checkpoint folder (config, safetensors
  weights, model card), written and read strictly;
- :mod:`~transformer_gmm.storage.checkpoints`: checkpoints by bundled name, folder or
  Hub id, and the shared models the estimators use;
- :mod:`~transformer_gmm.storage.hub`: downloads from the Hugging Face Hub, offline use,
  integrity checks;
- :mod:`~transformer_gmm.storage.cache`: the checkpoints in the local Hugging Face cache;
- :mod:`~transformer_gmm.storage.publish`: uploads to the Hub.

The model (:mod:`transformer_gmm.nn`) knows nothing of files: save, load and publish it
with the functions here.

Examples
--------
>>> import tempfile
>>> from transformer_gmm import storage
>>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
>>> model = MixtureTransformer(config_from_preset("tiny"))
>>> with tempfile.TemporaryDirectory() as tmp:
...     folder = storage.save_checkpoint(model, tmp)
...     copy = storage.load_checkpoint(folder)
>>> copy.config == model.config, copy.training
(True, False)
"""

from .checkpoints import export_checkpoint, load_checkpoint, load_model
from .format import CheckpointError, save_checkpoint
from .hub import download
from .publish import push_to_hub

__all__ = [
    "CheckpointError",
    "download",
    "export_checkpoint",
    "load_checkpoint",
    "load_model",
    "push_to_hub",
    "save_checkpoint",
]
