"""Whether a model named by a hub id can be loaded here, asked when a tier is saved.

A tier's `base_model` or `draft_model` that is a hub id (`org/model`) must be loadable by the
workers: a local directory of that name, a copy in the local Hugging Face cache, or a model the
hub answers for within FLYWHEEL_HUB_TIMEOUT_SECONDS. Otherwise the tier is refused at creation,
instead of its first evaluation hanging on a download that cannot happen. With HF_HUB_OFFLINE
(or TRANSFORMERS_OFFLINE) set, the hub is never asked: only local copies count. Paths are not
checked here (a tier may name the model `build_base_model` is about to write); a run checks them
when it is submitted.
"""

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from inference.settings import looks_like_path


def model_source_problem(reference: str, *, timeout: float) -> str | None:
    """Why the model `reference` cannot be loaded here, or None when it can (or is a path)."""
    reference = reference.strip()
    if not reference or looks_like_path(reference) or is_directory(reference):
        return None
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(reference)
    except HFValidationError as exc:
        return f"is not a hub id the hub accepts: {str(exc).split(':')[0]}"
    if isinstance(try_to_load_from_cache(reference, "config.json"), str):
        return None
    if constants.HF_HUB_OFFLINE:
        return (
            f"{reference} is not a local directory nor in the local Hugging Face cache, and the hub is "
            "off (HF_HUB_OFFLINE): give a local path, or download the model where a hub is reachable"
        )
    return hub_problem(reference, timeout=timeout)


def local_path_problem(reference: str) -> str | None:
    """Why a local model path cannot be loaded: no such folder here. None for a hub id.

    >>> print(local_path_problem("/no/such/folder"))
    no folder /no/such/folder on this machine: give a saved model's folder (save_pretrained) or a hub id
    >>> local_path_problem("org/model") is None, local_path_problem("/") is None
    (True, True)
    """
    reference = reference.strip()
    if not reference or not looks_like_path(reference) or is_directory(reference):
        return None
    return f"no folder {reference} on this machine: give a saved model's folder (save_pretrained) or a hub id"


def is_directory(reference: str) -> bool:
    """Whether a directory of that name exists here (a name too long for the system is none)."""
    try:
        return Path(reference).expanduser().is_dir()
    except OSError:
        return False


def hub_problem(reference: str, *, timeout: float) -> str | None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    # In a thread with its own deadline: name resolution is not covered by the client's timeout.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub-check")
    asking = pool.submit(HfApi().model_info, reference, timeout=timeout)
    pool.shutdown(wait=False)
    try:
        asking.result(timeout=timeout + 1)
    except FutureTimeout:
        return unreachable(reference, f"no answer in {timeout:g} s")
    except GatedRepoError:
        return f"{reference} is gated on the hub: download it with an account that may, and give its path"
    except RepositoryNotFoundError:
        return f"the hub has no model {reference}"
    except Exception as exc:  # noqa: BLE001 - any failure to reach the hub is reported, not raised
        return unreachable(reference, f"{type(exc).__name__}: {exc}")
    return None


def unreachable(reference: str, why: str) -> str:
    return (
        f"{reference} is not a local directory nor in the local Hugging Face cache, and the hub could "
        f"not be reached ({why}): give a local path"
    )


def local_models(models_dir: Path, *, limit: int = 50) -> list[str]:
    """The models present on this installation, for a tier form to offer: directories under
    `models_dir` holding a config.json (as paths), then models in the local Hugging Face cache (as
    hub ids). Nothing is downloaded or loaded."""
    found: list[str] = []
    try:
        found = sorted(str(path.parent) for path in Path(models_dir).glob("*/config.json"))
    except OSError:
        found = []
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
        found += sorted(
            entry.name.removeprefix("models--").replace("--", "/", 1)
            for entry in cache.glob("models--*")
            if entry.is_dir()
        )
    except (ImportError, OSError):
        pass
    return found[:limit]
