"""Environments the ecosystem already trains on, as graphs, datasets and rewards of this SDK.

- `reasoning_gym`: reasoning-gym's procedural tasks; the task's own verifier is the reward.
- `textarena`: textarena's text games; the game is a LangGraph loop, its outcome the reward.

Both need the ``environments`` extra (``pip install '.[environments]'``).
"""
