"""Evaluation: the end of the chain after training.

greedy.py      greedy accuracy during training (the trainer's eval_steps)
metrics.py     pass@k (unbiased), majority vote, lengths, truncation      thinking.py  thinking efficiency
benchmarks.py  GSM8K / MATH-500 / AIME / GPQA formats from local files     refs.py      model references
run.py         one evaluation -> results.json, samples.jsonl, status.json; cli.py = `python -m backend.eval`
compare.py     line up evaluations of several models: table, side by side, CSV
chat.py        streamed chat with a checkpoint                             export.py    merge LoRA and save
"""
