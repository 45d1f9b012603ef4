"""Hugging Face: the transformers model families and their parameter names (`mapping`), a model
directory against an actlab config both ways (`checkpoint`), and the export command line."""
