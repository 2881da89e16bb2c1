"""GRPO Studio's web UI (Gradio). It speaks RunSpec, the launcher and run directories only."""
