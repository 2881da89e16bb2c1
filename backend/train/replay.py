"""Success replay (algorithm.replay_solved): a prompt's last solved completion comes back into a group that has none.

Why: GRPO learns nothing from a group whose completions all score alike. When the policy drifts away from
the right answer of a prompt it used to solve (on the tiny addition task it sharpens a neighbouring digit
until no sample hits the right one), every later group of that prompt fails, and nothing pulls it back.
Putting the last solved completion of that prompt in place of one of the failures gives the group a right
answer with a positive advantage and the failures negative ones: the signal the prompt lost (ExGRPO and
RLEP replay successful trajectories for the same reason).

Contract: `apply` is called on each freshly scored group, in rollout order, before advantages are computed.
A group with a completion at or above `solved_at` (weighted reward) stores its first such completion for
its row; a group with none, whose row has one stored, gets it in its last place (completion, reward row
and all) and records that index in `ScoredGroup.replayed`. The store is plain data (`state_dict`), saved
in checkpoints, so a resumed run replays what the straight run would. The replayed completion is
off-policy: it keeps the sampling logprobs of the policy that drew it. Where the loss takes the engine's
logprobs as the old policy's (async generation; the sync hf engine with several updates per rollout) its ratio is then
against that policy, and importance weights and the off-policy mask see them too; where the trainer
recomputes the old logprobs it is weighted as if sampled now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.rollout.base import Completion
from backend.train.batch import ScoredGroup


@dataclass
class StoredSolution:
    completion: Completion
    rewards: np.ndarray  # its per-function reward row, as scored when it was sampled


class SolvedReplay:
    def __init__(self, solved_at: float):
        self.solved_at = solved_at  # the weighted reward at which a completion counts as solved
        self.store: dict[int, StoredSolution] = {}
        self.replayed = 0  # completions put back so far (a metric; not part of the state)

    def apply(self, group: ScoredGroup, totals: np.ndarray) -> bool:
        """Store the group's first solved completion, or replay its row's stored one into it; True if replayed.
        `totals`: each completion's weighted reward, as scored."""
        solved = np.flatnonzero(totals >= self.solved_at)
        if len(solved):
            k = int(solved[0])
            self.store[group.row] = StoredSolution(group.completions[k], group.rewards[k].copy())
            return False
        stored = self.store.get(group.row)
        if stored is None:
            return False
        last = len(group.completions) - 1
        group.completions[last] = stored.completion
        group.rewards[last] = stored.rewards
        group.replayed = (*group.replayed, last)
        self.replayed += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {str(row): {"token_ids": s.completion.token_ids, "text": s.completion.text,
                           "finish_reason": s.completion.finish_reason, "logprobs": s.completion.logprobs,
                           "rewards": s.rewards.tolist()} for row, s in self.store.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store = {int(row): StoredSolution(Completion(d["token_ids"], d["text"], d["finish_reason"], d["logprobs"]),
                                               np.asarray(d["rewards"], dtype=np.float32))
                      for row, d in state.items()}
