"""Hugging Face: the transformers model families and their parameter names (`mapping`) and a model
directory against an actlab config both ways (`checkpoint`; the export command: run/export.py)."""
