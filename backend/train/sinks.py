"""Extra metric sinks (output.report_to) behind one small interface; metrics.jsonl is always written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import wandb

        self.run = wandb.init(name=run_dir.name, dir=str(run_dir), config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class SwanlabSink:
    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import swanlab

        self.run = swanlab.init(experiment_name=run_dir.name, logdir=str(run_dir / "swanlab"), config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def make_sinks(report_to: list[str], run_dir: Path, config: dict[str, Any]) -> list[Sink]:
    sinks: list[Sink] = []
    for name in report_to:
        try:
            if name == "tensorboard":
                sinks.append(TensorBoardSink(run_dir))
            elif name == "wandb":
                sinks.append(WandbSink(run_dir, config))
            elif name == "swanlab":
                sinks.append(SwanlabSink(run_dir, config))
        except ImportError as err:
            raise RuntimeError(f"output.report_to: {name} is not installed ({err}); pip install {name}") from err
    return sinks
