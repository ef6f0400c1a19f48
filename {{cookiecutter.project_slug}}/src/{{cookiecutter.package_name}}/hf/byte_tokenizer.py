"""The tokenizer of a byte-level vocabulary: token id = byte value, 256 ids, any text.

Models built from a config here read raw bytes (ids 0-255) and need no tokenizer to train;
this one makes their exported directories whole: `AutoTokenizer.from_pretrained(DIR)`
encodes text to the same byte ids and decodes generated ids back to text.
"""

from __future__ import annotations

from typing import Any

BYTE_VOCAB = 256


def byte_tokenizer() -> Any:
    """A fast tokenizer whose ids are the UTF-8 bytes of the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # GPT-2's byte-level scheme maps each byte to a printable character; with no merges,
    # each character is its own token and its id is the byte.
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)
