"""``energy-router demo``: the whole loop on embedded defaults, offline.

An orchestration layer above both the serving path and the training package: it imports the bundled
RouterBench rows (minus a held-back share) into SQLite, trains the default router, serves the held-back
queries through a real ``litellm.Router`` with the energy strategy and the energy callback in front of a
local server that replays the recorded answers (:mod:`.replay`), labels the served rows with the recorded
correctness, runs one ``retrain`` and compares the served traffic with static baselines (:mod:`.loop`).

Training is imported lazily, inside functions, so importing this package stays light.
"""
