"""One run: its config to a trained state in a run directory (train → loop → steps), with
checkpoints, logs, provenance and the devices it runs on."""
