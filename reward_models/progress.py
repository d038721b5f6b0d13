"""A reward-model version's training progress, compact: what its page polls while it trains (and
REST's `progress`): status, step of steps, epoch of epochs, the last step's loss and batch accuracy,
held-out pair accuracy at each epoch's end, restarts and the checkpoint a restart resumes at.
`since` sends only the steps after it, so a page that polls gets each step once."""

from reward_models.models import RewardModelVersion

HISTORY_MAX = 2000  # steps per answer: a page far behind catches up over several polls


def version_progress(version: RewardModelVersion, *, since: int = 0) -> dict:
    history = version.history or []
    last = history[-1] if history else {}
    newer = [entry for entry in history if entry["step"] > since][:HISTORY_MAX]
    epochs = version.hyperparameters.get("epochs")
    return {
        "status": version.status,
        "terminal": version.is_terminal,
        "step": version.step,
        "steps": version.steps,
        "epoch": last.get("epoch", 0.0),
        "epochs": epochs,
        "loss": last.get("loss"),
        "accuracy": last.get("accuracy"),
        "heldout_accuracy_by_epoch": [
            {"step": entry["step"], "epoch": entry.get("epoch"), "accuracy": entry["heldout_accuracy"]}
            for entry in history
            if "heldout_accuracy" in entry
        ],
        "base_heldout_accuracy": version.base_heldout_accuracy,
        "heldout_accuracy": version.heldout_accuracy,
        "restarts": version.restarts,
        "checkpoint_step": version.checkpoint_step,
        "error": version.error,
        "history": [
            {name: entry.get(name) for name in ("step", "epoch", "loss", "accuracy", "heldout_accuracy")}
            for entry in newer
        ],
    }
