"""Checkpoints bundled with transformer_gmm: one folder each (config.json, model.safetensors,
README.md). The folder name is the name `checkpoint=` accepts."""
