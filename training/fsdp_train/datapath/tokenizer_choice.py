"""Which tokenizer a directory's user meant: ``AutoTokenizer``'s class when it gives the ids of the directory's own
``tokenizer.json``, else that ``tokenizer.json`` itself (``fsdp_train.datapath.data`` trains with it,
``fsdp_train.models.weights``
exports and pins it). Imports neither of them (both import this).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_TEXTS = (
    "In 2026 the 12 trains carried 1234567 people, 3.14159 each.",
    "x = 12345 + 67890  # two  spaces\tand a tab",
    "    indented code\n\n\nafter three line breaks",
    "héllo wörld — naïve café, 数据 and émoji ✓",
    "It's we'll THEY'RE don't 'quoted'",
)
"""Texts whose tokenization differs between byte-level BPE pre-tokenizers (digits, runs of spaces, line breaks,
contractions, non-ASCII): with the data's own rows, what `choose_tokenizer` compares on."""


@dataclass(frozen=True, slots=True)
class TokenizerChoice:
    tokenizer: Any
    why: str
    """Which class is used and why, in one sentence (``fsdpctl data check`` prints it)."""


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def choose_tokenizer(directory: str, samples: Iterable[str] = ()) -> TokenizerChoice:
    """The tokenizer the user gave: ``AutoTokenizer``'s choice when it gives the ids of the directory's own
    ``tokenizer.json`` on :data:`PROBE_TEXTS` and `samples`, else the directory's own tokenizer.

    transformers forces a class for some model types whatever ``tokenizer_config.json`` names (a qwen2
    ``config.json`` makes ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer and splits digits and spaces
    its own way). The export pins the class chosen here (``weights._write_hf_dir``), and its self-check loads
    it back with ``AutoTokenizer`` and compares the ids.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    auto = AutoTokenizer.from_pretrained(directory)
    name = type(auto).__name__
    if not (Path(directory) / "tokenizer.json").is_file():
        return TokenizerChoice(auto, f"{name}: AutoTokenizer's choice (no tokenizer.json beside it to compare with)")
    own = PreTrainedTokenizerFast.from_pretrained(directory)  # the directory's tokenizer.json as it is
    texts = [*PROBE_TEXTS, *(t for t in samples if isinstance(t, str) and t)]
    differ = [t for t in texts if _ids(auto, t) != _ids(own, t)]
    if not differ:
        return TokenizerChoice(
            auto,
            f"{name}: AutoTokenizer's choice, the same token ids as the directory's tokenizer.json on "
            f"{len(texts)} sampled texts",
        )
    auto_count = sum(len(_ids(auto, t)) for t in texts)
    own_count = sum(len(_ids(own, t)) for t in texts)
    return TokenizerChoice(
        own,
        f"{type(own).__name__} from the directory's tokenizer.json: AutoTokenizer would load {name}, which "
        f"tokenizes {len(differ)} of {len(texts)} sampled texts differently ({auto_count:,} tokens against "
        f"{own_count:,}); the export pins the directory's own",
    )
