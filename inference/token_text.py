"""Each generated token's own text, for showing a completion coloured token by token.

Rollouts record token ids and log-probabilities; the page shows text. The tokenizer is read from
the model's local files only (a directory, or a hub id already in the local cache): a page never
downloads one, and answers None when it cannot be read here.
"""

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=8)
def _tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer  # heavy: loaded on the first page that needs it

    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def token_texts(source: str, token_ids: list[int]) -> list[str] | None:
    """The text of each token in `token_ids`, or None when the tokenizer is not available here.

    A token that holds part of a multi-byte character shows as U+FFFD, as in any per-token view.
    """
    if not source or not token_ids:
        return None
    try:
        tokenizer = _tokenizer(source)
    except (OSError, ValueError, ImportError):
        return None
    return tokenizer.batch_decode([[token] for token in token_ids])
