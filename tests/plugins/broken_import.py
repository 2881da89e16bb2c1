raise RuntimeError("this plugin fails when imported")


def reward(completions, **kwargs):
    return [0.0] * len(completions)
