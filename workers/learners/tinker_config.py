"""Tinker API models as runs: the registration (torch-free: the web process reads it). A run of
`tinker` is made by the Tinker API (tinker_api/) when a client creates a training model; its
learner (workers/learners/tinker.py) keeps the model resident and runs the client's requests in
the order they came: forward passes, optimiser steps, saves and loads."""

from runs.learners import Algorithm, algorithm_register

TINKER = algorithm_register(
    Algorithm(
        name="tinker",
        label="Your own loop (Tinker API)",
        summary="a training loop of your own, written against the Tinker SDK (forward_backward, "
        "optim_step, sample): Flywheel keeps the model and runs each request; the loop sends the data",
        learner="workers.learners.tinker",
        online=False,
        data=False,
        launchable=False,
    )
)
