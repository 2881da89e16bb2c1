"""Training: the GRPO loop (`loop.py`), its loss math (`grpo.py`), the loss-pass forward (`forward.py`),
builders, metric sinks, telemetry and signal handling. `python -m backend.train` is the CLI (`cli.py`)."""
