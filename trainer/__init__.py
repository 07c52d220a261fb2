"""The bundled distributed trainer: `python -m trainer --config configs/X.toml [--set section.key=value ...]`."""
