"""`TreeEstimator` (Tree-GRPO) against a reference written leaf by leaf with plain Python."""

from __future__ import annotations

import statistics

import pytest
import torch

from agentrl_sdk.algorithms import Sequences, make_estimator

EPS = 1e-6
# Group "g": tree 0 branches twice (after its first step, then again under child 0), tree 1
# once; group "h" is one chain rollout. Leaf order is rollout order.
PATHS = [(0, 0, 0), (0, 0, 1), (0, 1), (1, 0), (1, 1), (0,)]
GROUPS = ["g", "g", "g", "g", "g", "h"]
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0, 3.0]


def grpo(reward: float, peers: list[float]) -> float:
    """One leaf's GRPO advantage among ``peers`` (itself included); 0 alone or all equal."""
    if len(peers) < 2 or len(set(peers)) == 1:
        return 0.0
    return (reward - statistics.fmean(peers)) / (statistics.stdev(peers) + EPS)


def reference(levels: str) -> list[float]:
    out = []
    for path, group, reward in zip(PATHS, GROUPS, REWARDS, strict=True):
        same_group = [i for i, g in enumerate(GROUPS) if g == group]
        adv = grpo(reward, [REWARDS[i] for i in same_group])  # inter-tree
        tree = [REWARDS[i] for i in same_group if PATHS[i][0] == path[0]]
        adv += grpo(reward, tree)  # intra-tree
        for d in range(2, len(path)) if levels == "branch" else ():
            # the leaves under each deeper branch point the leaf passed
            under = [REWARDS[i] for i in same_group if PATHS[i][:d] == path[:d]]
            adv += grpo(reward, under)
        out.append(adv)
    return out


def sequences(paths=PATHS) -> Sequences:
    # Leaf 0 has two sequences (its shared first step, then its own), the others one each.
    rollout = [0, 0, 1, 2, 3, 4, 5]
    return Sequences(
        rewards=torch.tensor([REWARDS[i] for i in rollout], dtype=torch.float64),
        rollout=torch.tensor(rollout),
        group_ids=GROUPS,
        mask=torch.ones(len(rollout), 3),
        tree_paths=paths,
    )


@pytest.mark.parametrize("levels", ["tree", "branch"])
def test_leaf_advantages_equal_the_reference(levels):
    est = make_estimator("tree", levels=levels)(sequences())
    want = torch.tensor(reference(levels), dtype=torch.float64)
    leaf_adv = est.advantages[:, 0][torch.tensor([0, 2, 3, 4, 5, 6])]
    torch.testing.assert_close(leaf_adv, want, atol=1e-9, rtol=0)
    assert (est.advantages == est.advantages[:, :1]).all()  # every token of a sequence
    assert est.advantages[0, 0] == est.advantages[1, 0]  # both of leaf 0's sequences
    assert est.advantages[6].abs().max() == 0  # a group of one chain rollout


def test_levels_differ_where_a_tree_branches_twice():
    tree = make_estimator("tree", levels="tree")(sequences()).advantages[:, 0]
    branch = make_estimator("tree", levels="branch")(sequences()).advantages[:, 0]
    assert torch.equal(tree[3:], branch[3:])  # leaves of one branch point: no deeper level
    assert (tree[[0, 2]] != branch[[0, 2]]).all()  # leaves 0, 1 also meet under (0, 0)


def test_chain_rollouts_get_the_plain_group_advantage():
    chains = sequences(paths=None)
    tree = make_estimator("tree")(chains).advantages
    torch.testing.assert_close(tree, make_estimator("grpo")(chains).advantages)


def test_paths_must_name_every_rollout():
    with pytest.raises(ValueError, match="tree_paths has 2 entries for 6 rollouts"):
        make_estimator("tree")(sequences(paths=PATHS[:2]))
