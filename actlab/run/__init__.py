"""The engine: runs from their config to a trained state (train → loop and its program, a lane per
run), the trackers their rows go to, parameters from elsewhere (`pretrained`) and a trained run
written for Hugging Face (`export`); what it stands on (devices, the run directory, checkpoints,
the metrics log) is actlab/infra/."""
