"""Tools for the agent tests: one that works, and each way a tool can fail."""

import os
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def explode(x: int) -> int:
    """Always raises.

    Args:
        x: Ignored.
    """
    raise ValueError(f"boom {x}")


def hang(x: int) -> int:
    """Never returns.

    Args:
        x: Ignored.
    """
    while True:
        time.sleep(0.01)


def die(x: int) -> int:
    """Kills its own process.

    Args:
        x: Ignored.
    """
    os._exit(3)


def swallow(x: int) -> int:
    """Catches every Exception while it loops: the timeout must still end it.

    Args:
        x: Ignored.
    """
    while True:
        try:
            time.sleep(0.01)
        except Exception:
            pass


class Countdown:
    """A 3-turn environment: it asks for the next number, and ends after 3 answers with reward 1 per turn that
    said anything."""

    def reset(self, row):
        self.left, self.said = 3, 0
        return None

    def step(self, message):
        self.left -= 1
        self.said += bool(message["content"].strip())
        if self.left <= 0:
            return {"observation": None, "done": True, "reward": float(self.said)}
        return {"observation": f"again {self.left}", "done": False, "reward": None}


class Greeter:
    """An environment whose reset gives a first observation."""

    def reset(self, row):
        return f"hello {row.get('prompt', '')}"

    def step(self, message):
        return "bye", True, 0.5


class Broken:
    """An environment whose step raises."""

    def reset(self, row):
        return None

    def step(self, message):
        raise RuntimeError("env broke")
