"""Hugging Face: the parameter-name mappings (BERT, GPT-2, the LLaMA-style classes), a model
directory against an actlab config both ways (`checkpoint`), and the export command line."""
