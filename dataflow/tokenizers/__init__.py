"""Tokenizers: text to token ids and back, exactly as the reference library gives them (see README.md)."""
